// CUDA kernel of PYQSA_GGML_OP_GDN_GATES (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_gdn_gates(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

struct gdn_gates_args {
    const float * alpha;  // [H, T, S], elements contiguous
    const float * beta;   // alpha's shape
    const float * dt;     // [H]
    const float * a;      // [H]
    float *       dst;    // [H, T, S, 2], contiguous
    int64_t       H, T, n;  // n = H * T * S, one half
    int64_t       a1, a2, b1, b2;  // alpha's and beta's row strides in floats
};

// the kernel's arguments for the op's node dst
gdn_gates_args pyqsa_cuda_gdn_gates_args(const ggml_tensor * dst);

// element i of the result (a thread each, 2 n of them; past them nothing): the decay gate in the
// first half and the write strength in the second, with the formulas of upstream's add,
// softplus, mul and sigmoid kernels (unary.cu), built with the same flags, so each element gets
// their bits; also where conv_step's launch computes the gates beside it (conv-step.cu)
static __device__ __forceinline__ void gdn_gates_element(const gdn_gates_args & g, const int64_t i) {
    if (i >= 2 * g.n) {
        return;
    }
    ggml_cuda_pdl_sync();
    const int64_t e = i < g.n ? i : i - g.n;
    const int64_t h = e % g.H, t = (e / g.H) % g.T, s = e / (g.H * g.T);
    if (i < g.n) {
        const float x  = __fadd_rn(g.alpha[h + t * g.a1 + s * g.a2], g.dt[h]);
        const float sp = (x > 20.0f) ? x : logf(1.0f + expf(x));
        g.dst[i]       = __fmul_rn(sp, g.a[h]);
    } else {
        g.dst[i] = 1.0f / (1.0f + expf(-g.beta[h + t * g.b1 + s * g.b2]));
    }
}
