// CPU kernel of PYQSA_GGML_OP_ADD_GATED: one row per work item, its gate computed once.
#include "add-gated.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "rows.h"

void pyqsa_cpu_add_gated(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * base = dst->src[0];  // [n, rows]
    const ggml_tensor * x    = dst->src[1];  // [n, rows]
    const ggml_tensor * g    = dst->src[2];  // [1, rows]
    const int64_t       n    = dst->ne[0];
    const int64_t       rows = dst->ne[1];

    for (int64_t r = params->ith; r < rows; r += params->nth) {
        const float   w   = pyqsa_gate_weight(*pyqsa_row_f32(g, r));
        const float * br  = pyqsa_row_f32(base, r);
        const float * xr  = pyqsa_row_f32(x, r);
        float *       out = pyqsa_row_f32(dst, r);
        for (int64_t i = 0; i < n; ++i) {
            out[i] = pyqsa_add_gated_element(br[i], xr[i], w);
        }
    }
}
