// CPU kernel of PYQSA_GGML_OP_QSA_PAGE_WRITE: rows split over the work items.
#include "qsa-page-write.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"
#include "qsa-page-convert.h"

#include <cstring>

void pyqsa_cpu_qsa_page_write(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * k        = dst->src[0];
    // no source rows: row i is written to row k_rows[i]
    const int64_t *     src_rows = dst->src[2] ? (const int64_t *) dst->src[2]->data : nullptr;
    const size_t        B        = k->nb[1];
    const size_t        B_store  = pyqsa_ggml_qsa_page_store_row(dst);
    const ggml_type     type     = pyqsa_ggml_qsa_page_store_type(dst);
    const int64_t       n        = ggml_nelements(dst->src[3]);
    for (int j = 0; j < 2; ++j) {  // K, then V
        const char *    rows     = (const char *) dst->src[j]->data;
        const int64_t * dst_rows = (const int64_t *) dst->src[3 + j]->data;
        char *          host     = (char *) pyqsa_ggml_host_ptr(dst, 2 + 2 * j);
        for (int64_t i = params->ith; i < n; i += params->nth) {
            if (dst_rows[i] < 0) {
                continue;
            }
            const int64_t from = src_rows ? src_rows[i] : i;
            GGML_ASSERT(from >= 0 && from < k->ne[1]);
            pyqsa_cpu_page_write_row(host + dst_rows[i] * B_store, type, rows + from * B, k->type, k->ne[0]);
        }
    }
}
