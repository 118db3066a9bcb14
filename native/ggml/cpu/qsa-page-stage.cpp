// CPU kernel of PYQSA_GGML_OP_QSA_PAGE_STAGE: one stream per work item.
#include "qsa-page-stage.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"

#include <algorithm>
#include <cstring>
#include <vector>

void pyqsa_cpu_qsa_page_stage(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * blocks  = dst->src[0];
    const int32_t *     n_paged = (const int32_t *) dst->src[1]->data;
    const ggml_tensor * stage   = dst->src[2];
    const int64_t       kb = blocks->ne[0], n_q = blocks->ne[1], ns = blocks->ne[2], S = stage->ne[1];
    const size_t        B  = stage->nb[1];
    int64_t             n_store = 0;
    const char *        store[2];
    for (int k = 0; k < 2; ++k) {
        store[k] = (const char *) pyqsa_ggml_qsa_page_store(dst, k, &n_store);
    }
    std::vector<int32_t> staged;
    for (int64_t s = params->ith; s < ns; s += params->nth) {
        const int32_t * b   = (const int32_t *) blocks->data + s * kb * n_q;
        int32_t *       out = (int32_t *) dst->data + s * kb * n_q;
        // the distinct stored blocks the stream's queries select, in increasing order
        staged.clear();
        for (int64_t e = 0; e < kb * n_q; ++e) {
            if (b[e] < n_paged[s * n_q + e / kb]) {
                GGML_ASSERT(b[e] >= 0 && b[e] < n_store);
                staged.push_back(b[e]);
            }
        }
        std::sort(staged.begin(), staged.end());
        staged.erase(std::unique(staged.begin(), staged.end()), staged.end());
        staged.resize(std::min<size_t>(staged.size(), S));  // the rest stay in the host store
        for (int64_t e = 0; e < kb * n_q; ++e) {
            const auto it = std::lower_bound(staged.begin(), staged.end(), b[e]);
            const bool in = b[e] < n_paged[s * n_q + e / kb] && it != staged.end() && *it == b[e];
            out[e]        = in ? (int32_t) (it - staged.begin()) : -1;
        }
        for (size_t i = 0; i < staged.size(); ++i) {
            for (int k = 0; k < 2; ++k) {
                const ggml_tensor * t = dst->src[2 + k];
                if (t != nullptr) {
                    std::memcpy((char *) t->data + s * t->nb[2] + i * B, store[k] + (s * n_store + staged[i]) * B, B);
                }
            }
        }
    }
}
