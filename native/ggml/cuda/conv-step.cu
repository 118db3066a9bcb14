// CUDA kernel of PYQSA_GGML_OP_CONV_STEP: a thread a (channel, sequence), its window's sum in the
// order of upstream's ssm_conv kernel (ssm-conv.cu, built with the same flags: the same FMAs, then
// its bias term, here a zero it cannot fold) and ggml_silu's function of it, then the state's store.
// A GDN_GATES right before it runs in the same launch (pyqsa_cuda_gdn_conv_fuse).
#include "conv-step.cuh"
#include "gdn-gates.cuh"
#include "pyqsa-cuda.cuh"
#include "pyqsa-env.h"
#include "pyqsa-ggml.h"

#include "ggml-cuda/unary.cuh"

#include <type_traits>

namespace {

constexpr int MAX_K = 8;  // the widest kernel taken (the model's is 4)
constexpr int BLOCK = 256;

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

// the (channel, sequence) i of C S (past them nothing)
template <int K>
__device__ __forceinline__ void conv_step_channel(const conv_step_args & a, const int64_t i) {
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
__global__ void conv_step(const conv_step_args a) {
    ggml_cuda_pdl_lc();
    conv_step_channel<K>(a, (int64_t) blockIdx.x * blockDim.x + threadIdx.x);
}

// conv_step's blocks, then the gates': a block either's
template <int K>
__global__ void gdn_conv_step(const conv_step_args a, const gdn_gates_args g, const unsigned conv_blocks) {
    ggml_cuda_pdl_lc();
    if (blockIdx.x < conv_blocks) {
        conv_step_channel<K>(a, (int64_t) blockIdx.x * blockDim.x + threadIdx.x);
    } else {
        gdn_gates_element(g, (int64_t) (blockIdx.x - conv_blocks) * blockDim.x + threadIdx.x);
    }
}

unsigned blocks_of(int64_t threads) {
    return (unsigned) ((threads + BLOCK - 1) / BLOCK);
}

conv_step_args args_of(const ggml_tensor * dst) {
    const ggml_tensor * x     = dst->src[1];
    const ggml_tensor * store = dst->src[3];
    return {
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
}

// f(std::integral_constant<int, K>) for the op's kernel width K
template <typename F> void with_width(const ggml_tensor * dst, F && f) {
    switch (dst->src[2]->ne[0]) {
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        case 8: f(std::integral_constant<int, 8>{}); break;
        default: GGML_ABORT("pyqsa conv_step: kernel width %lld", (long long) dst->src[2]->ne[0]);
    }
}

// whether one of node's inputs lies in t's bytes
bool reads(const ggml_tensor * node, const ggml_tensor * t) {
    for (const ggml_tensor * src : node->src) {
        if (pyqsa_cuda_bytes_overlap(src, t)) {
            return true;
        }
    }
    return false;
}

}  // namespace

bool pyqsa_cuda_conv_step_supported(const ggml_tensor * op) {
    return op->src[2]->ne[0] >= 2 && op->src[2]->ne[0] <= MAX_K;
}

void pyqsa_cuda_conv_step(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const conv_step_args                 a = args_of(dst);
    const ggml_cuda_kernel_launch_params p(blocks_of(a.C * a.S), BLOCK, 0, ctx.stream());
    with_width(dst, [&](auto k) { ggml_cuda_kernel_launch(conv_step<decltype(k)::value>, p, a); });
}

int pyqsa_cuda_gdn_conv_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i) {
    if (pyqsa_env_switch_on("PYQSA_CUDA_GDN_CONV_APART")) {
        return 0;
    }
    int j = i + 1;
    while (j < cgraph->n_nodes && pyqsa_cuda_node_is_noop(cgraph->nodes[j])) {
        ++j;
    }
    if (j >= cgraph->n_nodes) {
        return 0;
    }
    const ggml_tensor * gates = cgraph->nodes[i];
    const ggml_tensor * conv  = cgraph->nodes[j];
    if (conv->op != GGML_OP_PYQSA || ggml_get_op_params_i32(conv, 0) != PYQSA_GGML_OP_CONV_STEP ||
        (conv->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || !pyqsa_cuda_conv_step_supported(conv)) {
        return 0;
    }
    // at once, neither may touch what the other writes (conv_step's result and store): apart,
    // conv_step came after the gates, and the allocator may give its result the gates' inputs
    if (pyqsa_cuda_bytes_overlap(conv, gates) || reads(conv, gates) || reads(gates, conv) || reads(gates, conv->src[3])) {
        return 0;
    }
    const conv_step_args                 a = args_of(conv);
    const gdn_gates_args                 g = pyqsa_cuda_gdn_gates_args(gates);
    const unsigned                       conv_blocks = blocks_of(a.C * a.S);
    const ggml_cuda_kernel_launch_params p(conv_blocks + blocks_of(2 * g.n), BLOCK, 0, ctx.stream());
    with_width(conv, [&](auto k) { ggml_cuda_kernel_launch(gdn_conv_step<decltype(k)::value>, p, a, g, conv_blocks); });
    return j - i;
}
