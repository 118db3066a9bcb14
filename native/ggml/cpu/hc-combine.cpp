// CPU kernel of PYQSA_GGML_OP_HC_COMBINE: one (stream, token) row per work item, its weight
// computed once; the gated form's block output as pyqsa_cpu_add_gated computes its elements.
#include "hc-combine.h"

#include "add-gated.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "rows.h"

#include <cmath>

void pyqsa_cpu_hc_combine(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x        = dst->src[0];  // [n_embd, n_tokens]: the block's output, or the join's base
    const ggml_tensor * residual = dst->src[1];  // [n_embd, hc, n_tokens]
    const ggml_tensor * inject   = dst->src[2];  // [hc, n_tokens]
    const ggml_tensor * joined   = dst->src[3];  // [n_embd, n_tokens]: the join's x (nullptr: none)
    const ggml_tensor * gate     = dst->src[4];  // [1, n_tokens]: the join's g
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
        const float * jr  = joined ? pyqsa_row_f32(joined, t) : nullptr;
        const float   wj  = joined ? pyqsa_gate_weight(*pyqsa_row_f32(gate, t)) : 0.0f;
        for (int64_t e = 0; e < n_embd; ++e) {
            const float o = jr ? pyqsa_add_gated_element(xr[e], jr[e], wj) : xr[e];
            // the order of ggml_dsv4_hc_post's sum
            float sum = o * w;
            sum += rr[e];
            out[e] = sum;
        }
    }
}
