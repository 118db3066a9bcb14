// CPU kernel of PYQSA_GGML_OP_SAMPLE: pyqsa_sample_row on each row, rows spread over threads.
#include "sample.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"

void pyqsa_cpu_sample(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * logits = dst->src[0];  // [n_vocab, n_rows]
    const ggml_tensor * args   = dst->src[1];  // [8, n_rows]
    const ggml_tensor * adjust = dst->src[2];  // [4, max_adjust, n_rows] or null
    for (int64_t row = params->ith; row < logits->ne[1]; row += params->nth) {
        pyqsa_sample_row((const float *) ((const char *) logits->data + row * logits->nb[1]), logits->ne[0],
                         (const pyqsa_sample_params *) ((const char *) args->data + row * args->nb[1]),
                         adjust ? (const pyqsa_logit_adjust *) ((const char *) adjust->data + row * adjust->nb[2])
                                : nullptr,
                         adjust ? adjust->ne[1] : 0, (pyqsa_sample_result *) ((char *) dst->data + row * dst->nb[1]));
    }
}
