// CPU kernel of PYQSA_GGML_OP_RMS_NORM_GATED: one row per work item, each step as upstream's CPU
// ops take it: rms_norm's sum of the f32 squares in double and its scale, then the product by the
// weight (ggml_mul), the gate (ggml_sigmoid) and the product by it (ggml_mul), each rounded.
#include "rms-norm-gated.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/vec.h"
#include "ggml-impl.h"

#include <cmath>

void pyqsa_cpu_rms_norm_gated(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x   = dst->src[0];
    const float *       w   = (const float *) dst->src[1]->data;
    const ggml_tensor * z   = dst->src[2];
    const float         eps = ggml_get_op_params_f32(dst, 1);
    const int64_t       n = dst->ne[0], rows = ggml_nrows(dst);

    for (int64_t row = params->ith; row < rows; row += params->nth) {
        const int64_t i1 = row % dst->ne[1], i2 = (row / dst->ne[1]) % dst->ne[2], i3 = row / (dst->ne[1] * dst->ne[2]);
        const float * xr = (const float *) ((const char *) x->data + i1 * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3]);
        const float * zr = (const float *) ((const char *) z->data + i1 * z->nb[1] + i2 * z->nb[2] + i3 * z->nb[3]);
        float *       out = (float *) ((char *) dst->data + i1 * dst->nb[1] + i2 * dst->nb[2] + i3 * dst->nb[3]);
        ggml_float    sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            sum += (ggml_float) (xr[i] * xr[i]);
        }
        const float mean  = sum / n;
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < n; ++i) {
            const float normed = xr[i] * scale;
            const float gate   = 1.f / (1.f + expf(-zr[i]));
            out[i]             = (normed * w[i]) * gate;
        }
    }
}
