// CPU kernel of PYQSA_GGML_OP_QSA_TOPK: partial sort by (score desc, index asc), then the k
// winners in increasing index order. One row per work item.
#include "qsa-topk.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"

#include <algorithm>
#include <numeric>
#include <vector>

void pyqsa_cpu_qsa_topk(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * score = dst->src[0];  // [n, rows...]
    const int64_t n      = score->ne[0];
    const int64_t k      = dst->ne[0];
    const int64_t n_rows = ggml_nrows(score);

    std::vector<int32_t> idx(n);
    for (int64_t row = params->ith; row < n_rows; row += params->nth) {
        const float * x = (const float *) ((const char *) score->data + row * score->nb[1]);
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [x](int32_t a, int32_t b) {
            return x[a] > x[b] || (x[a] == x[b] && a < b);
        });
        std::sort(idx.begin(), idx.begin() + k);
        std::copy(idx.begin(), idx.begin() + k, (int32_t *) ((char *) dst->data + row * dst->nb[1]));
    }
}
