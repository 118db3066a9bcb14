// CPU kernel of PYQSA_GGML_OP_QSA_TOPK: partial sort by (score desc, index asc), then the k
// winners in increasing index order. One row per work item.
#include "qsa-topk.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

void pyqsa_cpu_qsa_topk(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * score = dst->src[0];  // [n, rows...]
    const int64_t n      = score->ne[0];
    const int64_t k      = dst->ne[0];
    const int64_t n_rows = ggml_nrows(score);

    const int32_t * n_vis = dst->src[1] ? (const int32_t *) dst->src[1]->data : nullptr;

    std::vector<int32_t> idx(n);
    std::vector<float>   val(n);
    for (int64_t row = params->ith; row < n_rows; row += params->nth) {
        const float * x   = (const float *) ((const char *) score->data + row * score->nb[1]);
        const int64_t vis = n_vis ? std::clamp<int64_t>(n_vis[row], 0, n) : n;
        std::copy(x, x + vis, val.begin());
        std::fill(val.begin() + vis, val.end(), -INFINITY);
        const float * v = val.data();
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [v](int32_t a, int32_t b) {
            return v[a] > v[b] || (v[a] == v[b] && a < b);
        });
        std::sort(idx.begin(), idx.begin() + k);
        std::copy(idx.begin(), idx.begin() + k, (int32_t *) ((char *) dst->data + row * dst->nb[1]));
    }
}
