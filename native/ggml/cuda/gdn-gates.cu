// CUDA kernel of PYQSA_GGML_OP_GDN_GATES: a thread an output element (gdn_gates_element).
#include "gdn-gates.cuh"

namespace {

__global__ void gdn_gates(const gdn_gates_args g) {
    ggml_cuda_pdl_lc();
    gdn_gates_element(g, (int64_t) blockIdx.x * blockDim.x + threadIdx.x);
}

}  // namespace

gdn_gates_args pyqsa_cuda_gdn_gates_args(const ggml_tensor * dst) {
    const ggml_tensor * alpha = dst->src[0];
    const ggml_tensor * beta  = dst->src[1];
    GGML_ASSERT(ggml_is_contiguous(dst));
    return {
        (const float *) alpha->data,
        (const float *) beta->data,
        (const float *) dst->src[2]->data,
        (const float *) dst->src[3]->data,
        (float *) dst->data,
        dst->ne[0],
        dst->ne[1],
        dst->ne[0] * dst->ne[1] * dst->ne[2],
        (int64_t) (alpha->nb[1] / sizeof(float)),
        (int64_t) (alpha->nb[2] / sizeof(float)),
        (int64_t) (beta->nb[1] / sizeof(float)),
        (int64_t) (beta->nb[2] / sizeof(float)),
    };
}

void pyqsa_cuda_gdn_gates(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const gdn_gates_args g = pyqsa_cuda_gdn_gates_args(dst);
    constexpr int        block = 256;
    const ggml_cuda_kernel_launch_params launch((unsigned) ((2 * g.n + block - 1) / block), block, 0, ctx.stream());
    ggml_cuda_kernel_launch(gdn_gates, launch, g);
}
