// CPU kernel of PYQSA_GGML_OP_CONV_STEP: the windows upstream's graph concatenates are written to
// the work buffer, each thread the channels upstream's ssm_conv gives it, and upstream's own
// ssm_conv runs over them (its sums are compiled as the compiler chose for it, FMA or not, so
// only calling it gives its bits); then, after a barrier, ggml's vectorized SiLU over each row
// (each element at the position it has in ggml_silu's row).
#include "conv-step.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/ops.h"
#include "ggml-cpu/vec.h"
#include "ggml-impl.h"

#include <algorithm>

size_t pyqsa_cpu_conv_step_work_size(const struct ggml_tensor * dst) {
    return (size_t) ggml_nelements(dst->src[2]) * dst->ne[2] * sizeof(float);
}

void pyqsa_cpu_conv_step(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * state  = dst->src[0];  // [K-1, C, S]
    const ggml_tensor * x      = dst->src[1];  // [C, 1, S]
    ggml_tensor *       kernel = dst->src[2];  // [K, C]
    const ggml_tensor * store  = dst->src[3];  // [(K-1) * C, S]
    const int64_t       K = kernel->ne[0], C = kernel->ne[1], S = dst->ne[2];

    // ggml_ssm_conv's input, [K, C, S], in the work buffer: the rows of the channels it gives
    // this thread (its split), and their tails to the store
    float *       win = (float *) params->wdata;
    const int64_t dr = (C + params->nth - 1) / params->nth;
    const int64_t c0 = dr * params->ith, c1 = std::min(c0 + dr, C);
    for (int64_t s = 0; s < S; ++s) {
        const float * xs  = (const float *) ((const char *) x->data + s * x->nb[2]);
        float *       sto = (float *) ((char *) store->data + s * store->nb[1]);
        for (int64_t c = c0; c < c1; ++c) {
            const float * st = (const float *) state->data + (s * C + c) * (K - 1);
            float *       w  = win + (s * C + c) * K;
            std::copy(st, st + K - 1, w);
            w[K - 1] = xs[c];
            std::copy(w + 1, w + K, sto + c * (K - 1));
        }
    }
    ggml_tensor input = {};
    input.type        = GGML_TYPE_F32;
    input.ne[0] = K, input.ne[1] = C, input.ne[2] = S, input.ne[3] = 1;
    input.nb[0] = sizeof(float), input.nb[1] = K * sizeof(float);
    input.nb[2] = input.nb[1] * C, input.nb[3] = input.nb[2] * S;
    input.data  = win;
    ggml_tensor conv = *dst;
    conv.op          = GGML_OP_SSM_CONV;
    std::fill(std::begin(conv.src), std::end(conv.src), nullptr);
    conv.src[0] = &input;
    conv.src[1] = kernel;
    ggml_compute_forward_ssm_conv(params, &conv);
    ggml_barrier(params->threadpool);

    for (int64_t s = params->ith; s < S; s += params->nth) {
        float * out = (float *) ((char *) dst->data + s * dst->nb[2]);
        ggml_vec_silu_f32((int) C, out, out);
    }
}
