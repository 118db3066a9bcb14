// CUDA kernel of PYQSA_GGML_OP_RMS_NORM_GATED: a block a row, as upstream's rms_norm kernel fused
// with its weight sums and rounds (norm.cu: the same block size for the row's width, each
// thread's squares in column order, common.cuh's block_reduce, rsqrtf), then the gate with the
// formula of upstream's sigmoid kernel times the normed value, as its unary-times-mul kernel
// takes them (unary.cu); built with the same flags, so each element gets their bits.
#include "rms-norm-gated.cuh"

namespace {

struct rms_norm_gated_args {
    const float * x;  // rows of n contiguous floats
    const float * w;  // [n]
    const float * z;  // x's shape
    float *       dst;  // contiguous, x's shape
    int           n;
    float         eps;
    int64_t       ne1, ne2;
    int64_t       x1, x2, x3, z1, z2, z3;  // row strides in floats
};

template <int block_size>
__global__ void rms_norm_gated(const rms_norm_gated_args a) {
    ggml_cuda_pdl_lc();
    const int64_t row = blockIdx.x;
    const int64_t i1 = row % a.ne1, i2 = (row / a.ne1) % a.ne2, i3 = row / (a.ne1 * a.ne2);
    const float * x   = a.x + i1 * a.x1 + i2 * a.x2 + i3 * a.x3;
    const float * z   = a.z + i1 * a.z1 + i2 * a.z2 + i3 * a.z3;
    float *       dst = a.dst + row * a.n;
    const int     tid = threadIdx.x;

    ggml_cuda_pdl_sync();
    float tmp = 0.0f;
    for (int col = tid; col < a.n; col += block_size) {
        const float xi = x[col];
        tmp += xi * xi;
    }
    __shared__ float s_sum[32];
    tmp = block_reduce<block_reduce_method::SUM, block_size>(tmp, s_sum);

    const float mean  = tmp / a.n;
    const float scale = rsqrtf(mean + a.eps);
    for (int col = tid; col < a.n; col += block_size) {
        const float normed = scale * x[col] * a.w[col];
        dst[col]           = (1.0f / (1.0f + expf(-z[col]))) * normed;
    }
}

}  // namespace

void pyqsa_cuda_rms_norm_gated(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * z = dst->src[2];
    GGML_ASSERT(ggml_is_contiguous(dst) && dst->ne[0] <= INT32_MAX);
    const int64_t             rows = ggml_nrows(dst);
    const rms_norm_gated_args a    = {
        (const float *) x->data,
        (const float *) dst->src[1]->data,
        (const float *) z->data,
        (float *) dst->data,
        (int) dst->ne[0],
        ggml_get_op_params_f32(dst, 1),
        dst->ne[1],
        dst->ne[2],
        (int64_t) (x->nb[1] / sizeof(float)),
        (int64_t) (x->nb[2] / sizeof(float)),
        (int64_t) (x->nb[3] / sizeof(float)),
        (int64_t) (z->nb[1] / sizeof(float)),
        (int64_t) (z->nb[2] / sizeof(float)),
        (int64_t) (z->nb[3] / sizeof(float)),
    };
    // upstream's choice of block for the row's width (norm.cu)
    if (a.n < 1024) {
        ggml_cuda_kernel_launch(rms_norm_gated<256>, ggml_cuda_kernel_launch_params((unsigned) rows, 256, 0, ctx.stream()), a);
    } else {
        ggml_cuda_kernel_launch(rms_norm_gated<1024>, ggml_cuda_kernel_launch_params((unsigned) rows, 1024, 0, ctx.stream()), a);
    }
}
