// CPU kernel of PYQSA_GGML_OP_QSA_PAGE_STAGE: one stream per work item.
#include "qsa-page-stage.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"
#include "qsa-page-convert.h"

#include <cstring>
#include <vector>

void pyqsa_cpu_qsa_page_stage(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * blocks  = dst->src[0];
    const int32_t *     n_paged = (const int32_t *) dst->src[1]->data;
    const ggml_tensor * stage   = dst->src[2];
    const int64_t       kb = blocks->ne[0], n_q = blocks->ne[1], ns = blocks->ne[2], S = stage->ne[1];
    const int64_t       b0 = ggml_get_op_params_i32(dst, 6);
    const size_t        B  = stage->nb[1];
    const size_t        B_store    = pyqsa_ggml_qsa_page_store_row(dst);
    const ggml_type     store_type = pyqsa_ggml_qsa_page_store_type(dst);
    int64_t             n_store = 0;
    const char *        store[2];
    for (int k = 0; k < 2; ++k) {
        store[k] = (const char *) pyqsa_ggml_qsa_page_store(dst, k, &n_store);
    }
    std::vector<char> wanted(S);
    for (int64_t s = params->ith; s < ns; s += params->nth) {
        const int32_t * b = (const int32_t *) blocks->data + s * kb * n_q;
        std::fill(wanted.begin(), wanted.end(), 0);
        for (int64_t e = 0; e < kb * n_q; ++e) {
            if (b[e] >= b0 && b[e] < b0 + S && b[e] < n_paged[s * n_q + e / kb]) {
                GGML_ASSERT(b[e] < n_store);
                wanted[b[e] - b0] = 1;
            }
        }
        int32_t n = 0;
        for (int64_t i = 0; i < S; ++i) {
            if (!wanted[i]) {
                continue;
            }
            for (int k = 0; k < 2; ++k) {
                const ggml_tensor * t = dst->src[2 + k];
                if (t != nullptr) {
                    pyqsa_cpu_page_fetch_row((char *) t->data + s * t->nb[2] + i * B, t->type,
                                             store[k] + (s * n_store + b0 + i) * B_store, store_type, t->ne[0]);
                }
            }
            ++n;
        }
        ((int32_t *) dst->data)[s] = n;
        if (dst->src[5] != nullptr) {
            ((int64_t *) dst->src[5]->data)[s] += n;
        }
    }
}
