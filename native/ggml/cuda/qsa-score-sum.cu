// CUDA kernel of PYQSA_GGML_OP_QSA_SCORE_SUM: a thread per 4 consecutive blocks of one output row
// (float4 loads and stores where the row allows), reading each head's product once and adding
// the ReLUs in head order, then scaling, as the CPU kernel does (same value bit for bit: plain
// f32 adds and one multiply, nothing to contract; the sums start at 0, and 0 + relu(p) is
// relu(p) exactly).
#include "qsa-score-sum.cuh"

namespace {

constexpr int THREADS = 256;

struct score_sum_args {
    const char * prod;
    float *      dst;  // contiguous [n_blocks, n_tps, ns]
    size_t       nb1, nb2, nb3;
    int          n_blocks, n_head, n_tps;
    float        scale;
};

__device__ __forceinline__ float relu(float x) {
    return x > 0.0f ? x : 0.0f;
}

// grid (ceil(n_blocks / (4 * THREADS)), n_tps * ns)
template <bool VEC4>
__global__ void __launch_bounds__(THREADS) qsa_score_sum(const score_sum_args a) {
    const int b0  = (blockIdx.x * THREADS + threadIdx.x) * 4;
    const int row = blockIdx.y;
    if (b0 >= a.n_blocks) {
        return;
    }
    const int    t   = row % a.n_tps;
    const int    s   = row / a.n_tps;
    const char * src = a.prod + (size_t) t * a.nb2 + (size_t) s * a.nb3;
    float *      out = a.dst + (size_t) row * a.n_blocks;
    if constexpr (VEC4) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int h = 0; h < a.n_head; ++h) {
            const float4 p = *(const float4 *) ((const float *) (src + (size_t) h * a.nb1) + b0);
            acc.x += relu(p.x);
            acc.y += relu(p.y);
            acc.z += relu(p.z);
            acc.w += relu(p.w);
        }
        *(float4 *) (out + b0) = make_float4(acc.x * a.scale, acc.y * a.scale, acc.z * a.scale, acc.w * a.scale);
    } else {
        for (int b = b0; b < min(b0 + 4, a.n_blocks); ++b) {
            float acc = 0.0f;
            for (int h = 0; h < a.n_head; ++h) {
                acc += relu(((const float *) (src + (size_t) h * a.nb1))[b]);
            }
            out[b] = acc * a.scale;
        }
    }
}

}  // namespace

bool pyqsa_cuda_qsa_score_sum_supported(const ggml_tensor * op) {
    return op->src[0]->ne[2] * op->src[0]->ne[3] <= 65535;
}

void pyqsa_cuda_qsa_score_sum(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * prod = dst->src[0];  // [n_blocks, n_head, n_tps, ns]
    score_sum_args a;
    a.prod     = (const char *) prod->data;
    a.dst      = (float *) dst->data;
    a.nb1      = prod->nb[1];
    a.nb2      = prod->nb[2];
    a.nb3      = prod->nb[3];
    a.n_blocks = (int) prod->ne[0];
    a.n_head   = (int) prod->ne[1];
    a.n_tps    = (int) prod->ne[2];
    a.scale    = ggml_get_op_params_f32(dst, 1);
    const int  rows = (int) (prod->ne[2] * prod->ne[3]);
    const dim3 grid((a.n_blocks + 4 * THREADS - 1) / (4 * THREADS), rows);
    // float4 needs every head row 16-byte aligned: the rows' starts and strides
    const bool vec4 = a.n_blocks % 4 == 0 && (uintptr_t) a.prod % 16 == 0 && a.nb1 % 16 == 0 && a.nb2 % 16 == 0 &&
                      a.nb3 % 16 == 0 && (uintptr_t) a.dst % 16 == 0;
    if (vec4) {
        qsa_score_sum<true><<<grid, THREADS, 0, ctx.stream()>>>(a);
    } else {
        qsa_score_sum<false><<<grid, THREADS, 0, ctx.stream()>>>(a);
    }
    CUDA_CHECK(cudaGetLastError());
}
