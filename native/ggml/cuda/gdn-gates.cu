// CUDA kernel of PYQSA_GGML_OP_GDN_GATES: a thread an output element, the decay gate in the first
// half and the write strength in the second, with the formulas of upstream's add, softplus, mul
// and sigmoid kernels (unary.cu), built with the same flags, so each element gets their bits.
#include "gdn-gates.cuh"

namespace {

struct gdn_gates_args {
    const float * alpha;  // [H, T, S], elements contiguous
    const float * beta;   // alpha's shape
    const float * dt;     // [H]
    const float * a;      // [H]
    float *       dst;    // [H, T, S, 2], contiguous
    int64_t       H, T, n;  // n = H * T * S, one half
    int64_t       a1, a2, b1, b2;  // alpha's and beta's row strides in floats
};

__global__ void gdn_gates(const gdn_gates_args g) {
    ggml_cuda_pdl_lc();
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
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

}  // namespace

void pyqsa_cuda_gdn_gates(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * alpha = dst->src[0];
    const ggml_tensor * beta  = dst->src[1];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const int64_t        n = dst->ne[0] * dst->ne[1] * dst->ne[2];
    const gdn_gates_args g = {
        (const float *) alpha->data,
        (const float *) beta->data,
        (const float *) dst->src[2]->data,
        (const float *) dst->src[3]->data,
        (float *) dst->data,
        dst->ne[0],
        dst->ne[1],
        n,
        (int64_t) (alpha->nb[1] / sizeof(float)),
        (int64_t) (alpha->nb[2] / sizeof(float)),
        (int64_t) (beta->nb[1] / sizeof(float)),
        (int64_t) (beta->nb[2] / sizeof(float)),
    };
    constexpr int block = 256;
    const ggml_cuda_kernel_launch_params launch((unsigned) ((2 * n + block - 1) / block), block, 0, ctx.stream());
    ggml_cuda_kernel_launch(gdn_gates, launch, g);
}
