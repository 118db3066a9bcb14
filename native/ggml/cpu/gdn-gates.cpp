// CPU kernel of PYQSA_GGML_OP_GDN_GATES: one (token, sequence) row of both gates per work item.
#include "gdn-gates.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "rows.h"

#include <cmath>

void pyqsa_cpu_gdn_gates(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * alpha = dst->src[0];  // [H, T, S]
    const ggml_tensor * beta  = dst->src[1];  // [H, T, S]
    const float *       dt    = (const float *) dst->src[2]->data;  // [H]
    const float *       a     = (const float *) dst->src[3]->data;  // [H]
    const int64_t       H     = dst->ne[0];
    const int64_t       rows  = ggml_nrows(alpha);

    for (int64_t row = params->ith; row < rows; row += params->nth) {
        const float * ar   = pyqsa_row_f32(alpha, row);
        const float * br   = pyqsa_row_f32(beta, row);
        float *       gate = pyqsa_row_f32(dst, row);  // the first half's
        float *       bout = (float *) ((char *) gate + dst->nb[3]);
        for (int64_t h = 0; h < H; ++h) {
            // ggml_add, ggml_softplus (upstream's CPU formula) and ggml_mul, each rounded to f32
            const float x  = ar[h] + dt[h];
            const float sp = (x > 20.0f) ? x : logf(1.0f + expf(x));
            gate[h]        = sp * a[h];
            bout[h]        = 1.f / (1.f + expf(-br[h]));  // ggml_sigmoid's
        }
    }
}
