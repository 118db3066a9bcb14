// CUDA kernel of PYQSA_GGML_OP_SILU_SCALED: a thread an element, ggml_scale's product then
// ggml_silu's function of it (common.cuh), as upstream's two kernels compute them.
#include "silu-scaled.cuh"

namespace {

struct silu_scaled_args {
    const float * x;  // rows of ne0 contiguous floats
    float *       dst;  // contiguous, x's shape
    float         scale;
    int64_t       ne0, ne1, ne2, n;
    int64_t       s1, s2, s3;  // x's row strides in floats
};

__global__ void silu_scaled(const silu_scaled_args a) {
    ggml_cuda_pdl_lc();
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) {
        return;
    }
    ggml_cuda_pdl_sync();
    const int64_t i0 = i % a.ne0, i1 = (i / a.ne0) % a.ne1, i2 = (i / (a.ne0 * a.ne1)) % a.ne2;
    const int64_t i3 = i / (a.ne0 * a.ne1 * a.ne2);
    a.dst[i] = ggml_cuda_op_silu_single(a.x[i0 + i1 * a.s1 + i2 * a.s2 + i3 * a.s3] * a.scale);
}

}  // namespace

void pyqsa_cuda_silu_scaled(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const int64_t          n = ggml_nelements(dst);
    const silu_scaled_args a = {
        (const float *) x->data,
        (float *) dst->data,
        ggml_get_op_params_f32(dst, 1),
        dst->ne[0],
        dst->ne[1],
        dst->ne[2],
        n,
        (int64_t) (x->nb[1] / sizeof(float)),
        (int64_t) (x->nb[2] / sizeof(float)),
        (int64_t) (x->nb[3] / sizeof(float)),
    };
    constexpr int block = 256;
    const ggml_cuda_kernel_launch_params launch((unsigned) ((n + block - 1) / block), block, 0, ctx.stream());
    ggml_cuda_kernel_launch(silu_scaled, launch, a);
}
