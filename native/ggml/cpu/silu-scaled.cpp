// CPU kernel of PYQSA_GGML_OP_SILU_SCALED: one row per work item, scaled into the output row,
// then ggml's own vectorized SiLU over it in place (so each element is at the position of the
// row it has in ggml_silu, and gets its bits).
#include "silu-scaled.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/vec.h"
#include "ggml-impl.h"
#include "rows.h"

void pyqsa_cpu_silu_scaled(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x     = dst->src[0];
    const float         scale = ggml_get_op_params_f32(dst, 1);
    const int           n     = (int) dst->ne[0];
    const int64_t       rows  = ggml_nrows(dst);

    for (int64_t row = params->ith; row < rows; row += params->nth) {
        const float * xr = pyqsa_row_f32(x, row);
        float *       yr = pyqsa_row_f32(dst, row);
        for (int i = 0; i < n; ++i) {
            yr[i] = xr[i] * scale;  // ggml_scale's product
        }
        ggml_vec_silu_f32(n, yr, yr);
    }
}
