// CPU kernel of PYQSA_GGML_OP_QSA_MASK_CELLS: one query row per work item.
#include "qsa-mask-cells.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"

#include <cmath>

void pyqsa_cpu_qsa_mask_cells(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * mask = dst->src[0];  // [n_kv, n_tps, 1, ns]

    const int64_t n_kv  = mask->ne[0];
    const int64_t n_tps = mask->ne[1];
    const int64_t ns    = mask->ne[3];
    const int64_t n_sel = dst->ne[0];

    for (int64_t row = params->ith; row < n_tps * ns; row += params->nth) {
        const int64_t i = row % n_tps;
        const int64_t s = row / n_tps;
        const char * src = (const char *) mask->data + i * mask->nb[1] + s * mask->nb[3];
        int32_t *    out = (int32_t *) ((char *) dst->data + i * dst->nb[1] + s * dst->nb[2]);
        int64_t      n   = 0;
        for (int64_t c = 0; c < n_kv && n < n_sel; ++c) {
            const float x = mask->type == GGML_TYPE_F32 ? ((const float *) src)[c]
                                                        : GGML_FP16_TO_FP32(((const ggml_fp16_t *) src)[c]);
            if (x != -INFINITY) {
                out[n++] = (int32_t) c;
            }
        }
        for (; n < n_sel; ++n) {
            out[n] = -1;
        }
    }
}
