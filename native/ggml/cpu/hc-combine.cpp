// CPU kernel of PYQSA_GGML_OP_HC_COMBINE: one (stream, token) row per work item, its weight
// computed once.
#include "hc-combine.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "rows.h"

#include <cmath>

void pyqsa_cpu_hc_combine(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x        = dst->src[0];  // [n_embd, n_tokens]
    const ggml_tensor * residual = dst->src[1];  // [n_embd, hc, n_tokens]
    const ggml_tensor * inject   = dst->src[2];  // [hc, n_tokens]
    const float         scale    = ggml_get_op_params_f32(dst, 1);
    const int64_t       n_embd   = dst->ne[0];
    const int64_t       hc       = dst->ne[1];
    const int64_t       rows     = hc * dst->ne[2];

    for (int64_t row = params->ith; row < rows; row += params->nth) {
        const int64_t c = row % hc, t = row / hc;
        // ggml_scale, ggml_sigmoid and ggml_scale by 2, each rounded to f32 as those ops round
        const float   s  = *(const float *) ((const char *) inject->data + c * inject->nb[0] + t * inject->nb[1]) * scale;
        const float   sg = 1.f / (1.f + expf(-s));
        const float   w  = sg * 2.0f;
        const float * xr  = pyqsa_row_f32(x, t);
        const float * rr  = pyqsa_row_f32(residual, row);
        float *       out = pyqsa_row_f32(dst, row);
        for (int64_t e = 0; e < n_embd; ++e) {
            // the order of ggml_dsv4_hc_post's sum
            float sum = xr[e] * w;
            sum += rr[e];
            out[e] = sum;
        }
    }
}
