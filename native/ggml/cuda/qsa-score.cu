// CUDA kernel of PYQSA_GGML_OP_QSA_SCORE: one warp per block key, read once (coalesced, lane
// owns elements d = i*32 + lane), dotted with every (query, head) of its stream in f32 FMAs; the
// queries are small and stay in L1. Heads are summed in order after the ReLU, then scaled, as
// the CPU kernel does. Prefill chunks (many queries) go to the tensor-core kernel instead
// (qsa-score-mma.cu).
#include "qsa-score.cuh"

#include "qsa-score-mma.cuh"

namespace {

constexpr int WARP  = 32;
constexpr int WARPS = 8;

// grid (ceil(n_blocks / WARPS), ns), WARPS warps
template <int DPL>
__global__ void qsa_score(const qsa_score_args a) {
    const int lane = threadIdx.x % WARP;
    const int b    = blockIdx.x * WARPS + threadIdx.x / WARP;
    const int s    = blockIdx.y;
    if (b >= a.n_blocks) {
        return;
    }
    const float * key = (const float *) (a.keys + (size_t) b * a.k_nb1 + (size_t) s * a.k_nb2);
    float kv[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        kv[i] = key[i * WARP + lane];
    }
    for (int t = 0; t < a.n_tps; ++t) {
        float acc = 0.0f;
        for (int h = 0; h < a.n_head; ++h) {
            const float * qrow = (const float *) (a.q + h * a.q_nb1 + t * a.q_nb2 + s * a.q_nb3);
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                dot = fmaf(qrow[i * WARP + lane], kv[i], dot);
            }
            acc += fmaxf(warp_reduce_sum(dot), 0.0f);
        }
        if (lane == 0) {
            a.dst[((size_t) s * a.n_tps + t) * a.n_blocks + b] = acc * a.scale;
        }
    }
}

template <int DPL>
void launch(const qsa_score_args & a, int ns, cudaStream_t stream) {
    const dim3 grid((a.n_blocks + WARPS - 1) / WARPS, ns);
    qsa_score<DPL><<<grid, WARPS * WARP, 0, stream>>>(a);
}

}  // namespace

bool pyqsa_cuda_qsa_score_supported(const ggml_tensor * op) {
    const int64_t D = op->src[0]->ne[0];
    const int64_t dpl = D / WARP;
    return D % WARP == 0 && D <= 512 && (dpl & (dpl - 1)) == 0 && op->src[0]->ne[3] <= 65535;
}

void pyqsa_cuda_qsa_score(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor *  q = dst->src[0];
    const qsa_score_args a = qsa_score_args_of(dst);
    if (pyqsa_cuda_qsa_score_mma(ctx, dst, a)) {
        return;
    }
    const int ns = (int) q->ne[3];
    switch (q->ne[0] / WARP) {
        case 1:  launch<1>(a, ns, ctx.stream());  break;
        case 2:  launch<2>(a, ns, ctx.stream());  break;
        case 4:  launch<4>(a, ns, ctx.stream());  break;
        case 8:  launch<8>(a, ns, ctx.stream());  break;
        case 16: launch<16>(a, ns, ctx.stream()); break;
        default: GGML_ABORT("qsa_score: head dim %lld", (long long) q->ne[0]);
    }
    CUDA_CHECK(cudaGetLastError());
}
