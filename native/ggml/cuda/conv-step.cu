// CUDA kernel of PYQSA_GGML_OP_CONV_STEP: a thread a (channel, sequence), its window's sum in the
// order of upstream's ssm_conv kernel (ssm-conv.cu, built with the same flags: the same FMAs, then
// its bias term, here a zero it cannot fold) and ggml_silu's function of it, then the state's store.
#include "conv-step.cuh"

#include "ggml-cuda/unary.cuh"

namespace {

constexpr int MAX_K = 8;  // the widest kernel taken (the model's is 4)

struct conv_step_args {
    const float * state;   // [K-1, C, S], contiguous
    const float * x;       // [C, 1, S], elements contiguous
    const float * kernel;  // [K, C], contiguous
    float *       store;   // [(K-1) * C, S], rows contiguous
    float *       dst;     // [C, 1, S], contiguous
    float         zero;    // upstream's absent bias, read at run time
    int64_t       C, S;
    int64_t       x2, store1;  // x's sequence stride and store's row stride, in floats
};

template <int K>
__global__ void conv_step(const conv_step_args a) {
    ggml_cuda_pdl_lc();
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.C * a.S) {
        return;
    }
    const int64_t c = i % a.C, s = i / a.C;
    ggml_cuda_pdl_sync();
    float         win[K];
    const float * st = a.state + (s * a.C + c) * (K - 1);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
        win[j] = st[j];
    }
    win[K - 1]      = a.x[c + s * a.x2];
    const float * w = a.kernel + c * K;
    float         sumf = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        sumf += win[j] * w[j];
    }
    sumf += a.zero;
    a.dst[i] = ggml_cuda_op_silu_single(sumf);
    float * sto = a.store + s * a.store1 + c * (K - 1);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
        sto[j] = win[j + 1];
    }
}

template <int K>
void launch(const conv_step_args & a, cudaStream_t stream) {
    constexpr int                        block = 256;
    const ggml_cuda_kernel_launch_params launch_params((unsigned) ((a.C * a.S + block - 1) / block), block, 0, stream);
    ggml_cuda_kernel_launch(conv_step<K>, launch_params, a);
}

}  // namespace

bool pyqsa_cuda_conv_step_supported(const ggml_tensor * op) {
    return op->src[2]->ne[0] >= 2 && op->src[2]->ne[0] <= MAX_K;
}

void pyqsa_cuda_conv_step(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor *  x     = dst->src[1];
    const ggml_tensor *  store = dst->src[3];
    const conv_step_args a     = {
        (const float *) dst->src[0]->data,
        (const float *) x->data,
        (const float *) dst->src[2]->data,
        (float *) store->data,
        (float *) dst->data,
        0.0f,
        dst->ne[0],
        dst->ne[2],
        (int64_t) (x->nb[2] / sizeof(float)),
        (int64_t) (store->nb[1] / sizeof(float)),
    };
    cudaStream_t stream = ctx.stream();
    switch (dst->src[2]->ne[0]) {
        case 2: launch<2>(a, stream); break;
        case 3: launch<3>(a, stream); break;
        case 4: launch<4>(a, stream); break;
        case 5: launch<5>(a, stream); break;
        case 6: launch<6>(a, stream); break;
        case 7: launch<7>(a, stream); break;
        case 8: launch<8>(a, stream); break;
        default: GGML_ABORT("pyqsa conv_step: kernel width %lld", (long long) dst->src[2]->ne[0]);
    }
}
