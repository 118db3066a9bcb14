// CPU kernel of PYQSA_GGML_OP_QSA_PAGE_FETCH: each stream's stored rows copied in place, the
// streams' K and V split over the work items. The wait has nothing to do on the CPU: the copy
// is done when the node returns.
#include "qsa-page-fetch.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"

#include <algorithm>
#include <cstring>

void pyqsa_cpu_qsa_page_fetch(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * area       = dst->src[0];
    const int64_t       n_rows     = area->ne[1];
    const int64_t       ns         = area->ne[2];
    const int64_t       store_rows = ggml_get_op_params_i32(dst, 1);
    const size_t        B          = area->nb[1];
    // work item i copies part i % nth of every (stream, K or V) pair, so two streams or one
    // long one keep every thread busy alike
    const int64_t chunk = (n_rows + params->nth - 1) / params->nth;
    const int64_t lo = params->ith * chunk, hi = std::min(n_rows, lo + chunk);
    if (lo >= hi) {
        return;
    }
    for (int j = 0; j < 2; ++j) {
        char *       rows  = (char *) dst->src[j]->data;
        const char * store = (const char *) pyqsa_ggml_host_ptr(dst, 2 + 2 * j);
        for (int64_t s = 0; s < ns; ++s) {
            std::memcpy(rows + s * area->nb[2] + lo * B, store + (s * store_rows + lo) * B, (hi - lo) * B);
        }
    }
}
