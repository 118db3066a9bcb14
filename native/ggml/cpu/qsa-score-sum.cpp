// CPU kernel of PYQSA_GGML_OP_QSA_SCORE_SUM: thread i takes output rows (query, stream) i,
// i + nth, ... and walks a row's heads in order, so every element is
// scale * (((relu(p0) + relu(p1)) + relu(p2)) + ...), as the CUDA kernel computes it.
#include "qsa-score-sum.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"

void pyqsa_cpu_qsa_score_sum(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * prod  = dst->src[0];  // [n_blocks, n_head, n_tps, ns]
    const float         scale = ggml_get_op_params_f32(dst, 1);

    const int64_t n_blocks = prod->ne[0];
    const int64_t n_head   = prod->ne[1];
    const int64_t n_tps    = prod->ne[2];
    const int64_t n_rows   = n_tps * prod->ne[3];

    for (int64_t row = params->ith; row < n_rows; row += params->nth) {
        const int64_t t   = row % n_tps;
        const int64_t s   = row / n_tps;
        const char *  src = (const char *) prod->data + t * prod->nb[2] + s * prod->nb[3];
        float *       out = (float *) ((char *) dst->data + t * dst->nb[1] + s * dst->nb[2]);
        for (int64_t h = 0; h < n_head; ++h) {
            const float * p = (const float *) (src + h * prod->nb[1]);
            if (h == 0) {
                for (int64_t b = 0; b < n_blocks; ++b) {
                    out[b] = p[b] > 0.0f ? p[b] : 0.0f;
                }
            } else {
                for (int64_t b = 0; b < n_blocks; ++b) {
                    out[b] += p[b] > 0.0f ? p[b] : 0.0f;
                }
            }
        }
        for (int64_t b = 0; b < n_blocks; ++b) {
            out[b] *= scale;
        }
    }
}
