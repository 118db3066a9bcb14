// CUDA kernel of PYQSA_GGML_OP_ADD_GATED: a thread an element (add_gated_element).
#include "add-gated.cuh"

namespace {

struct add_gated_args {
    const float * base;  // [n, rows], elements contiguous
    const float * x;     // base's shape
    const float * g;     // [1, rows]
    float *       dst;   // [n, rows], contiguous
    int64_t       n, total;
    int64_t       base1, x1, g1;  // row strides in floats
};

__global__ void add_gated(const add_gated_args a) {
    ggml_cuda_pdl_lc();
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.total) {
        return;
    }
    ggml_cuda_pdl_sync();
    const int64_t c = i % a.n, r = i / a.n;
    a.dst[i]        = add_gated_element(a.base[c + r * a.base1], a.x[c + r * a.x1], a.g[r * a.g1]);
}

}  // namespace

void pyqsa_cuda_add_gated(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * base = dst->src[0];
    const ggml_tensor * x    = dst->src[1];
    const ggml_tensor * g    = dst->src[2];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const int64_t        total = ggml_nelements(dst);
    const add_gated_args a     = {
        (const float *) base->data,
        (const float *) x->data,
        (const float *) g->data,
        (float *) dst->data,
        dst->ne[0],
        total,
        (int64_t) (base->nb[1] / sizeof(float)),
        (int64_t) (x->nb[1] / sizeof(float)),
        (int64_t) (g->nb[1] / sizeof(float)),
    };
    constexpr int block = 256;
    const ggml_cuda_kernel_launch_params launch((unsigned) ((total + block - 1) / block), block, 0, ctx.stream());
    ggml_cuda_kernel_launch(add_gated, launch, a);
}
