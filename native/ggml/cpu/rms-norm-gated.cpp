// CPU kernel of PYQSA_GGML_OP_RMS_NORM_GATED: one row per work item, each step as upstream's CPU
// ops take it: rms_norm's sum of the f32 squares in double and its scale, then the product by the
// weight (ggml_mul), the gate (ggml_sigmoid) and the product by it (ggml_mul), each rounded.
#include "rms-norm-gated.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/vec.h"
#include "ggml-impl.h"
#include "rows.h"

#include <cmath>

void pyqsa_cpu_rms_norm_gated(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x   = dst->src[0];
    const float *       w   = (const float *) dst->src[1]->data;
    const ggml_tensor * z   = dst->src[2];
    const float         eps = ggml_get_op_params_f32(dst, 1);
    const int64_t       n = dst->ne[0], rows = ggml_nrows(dst);

    for (int64_t row = params->ith; row < rows; row += params->nth) {
        const float * xr  = pyqsa_row_f32(x, row);
        const float * zr  = pyqsa_row_f32(z, row);
        float *       out = pyqsa_row_f32(dst, row);
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
