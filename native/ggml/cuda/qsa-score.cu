// CUDA kernel of PYQSA_GGML_OP_QSA_SCORE: a warp takes BPW consecutive block keys, each read once
// (coalesced, lane owns elements d = i*32 + lane; all BPW loaded before any product, so a warp has
// BPW rows in flight), dotted with every (query, head) of its stream in f32 FMAs; the queries are
// small and stay in L1. The BPW dot products of a head are summed across the warp in one
// butterfly that halves the values a lane holds at its first two steps (6 shuffles for 4 blocks,
// not 20): each sum pairs the lanes of the plain butterfly (16, 8, 4, 2, 1) in its order, so every
// block's score has the bits a warp of its own gives it. Heads are summed in order after the
// ReLU, then scaled, as the CPU kernel does. Prefill chunks (many queries) go to the tensor-core
// kernel instead (qsa-score-mma.cu).
#include "qsa-score.cuh"

#include "qsa-score-mma.cuh"

namespace {

constexpr int WARP  = 32;
constexpr int WARPS = 8;
constexpr int BPW   = 4;  // block keys a warp

// the warp's sums of v[0..3] (lane L's partials): lanes 8j .. 8j + 7 get the sum of v[j]
__device__ __forceinline__ float warp_sums4(const float (&v)[BPW], int lane) {
    const bool  hi16 = lane & 16, hi8 = lane & 8;
    // keep v[2 hi16], v[2 hi16 + 1]; send the other pair to lane ^ 16, which keeps it
    float       k0   = hi16 ? v[2] : v[0], k1 = hi16 ? v[3] : v[1];
    const float s0   = hi16 ? v[0] : v[2], s1 = hi16 ? v[1] : v[3];
    k0 += __shfl_xor_sync(0xffffffffu, s0, 16);
    k1 += __shfl_xor_sync(0xffffffffu, s1, 16);
    float       x    = hi8 ? k1 : k0;
    x += __shfl_xor_sync(0xffffffffu, hi8 ? k0 : k1, 8);
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

// grid (ceil(n_blocks / (WARPS * BPW)), ns), WARPS warps
template <int DPL>
__global__ void qsa_score(const qsa_score_args a) {
    const int lane = threadIdx.x % WARP;
    const int b0   = (blockIdx.x * WARPS + threadIdx.x / WARP) * BPW;
    const int s    = blockIdx.y;
    if (b0 >= a.n_blocks) {
        return;
    }
    float kv[BPW][DPL];
#pragma unroll
    for (int j = 0; j < BPW; ++j) {
        const float * key = (const float *) (a.keys + (size_t) min(b0 + j, a.n_blocks - 1) * a.k_nb1 +
                                             (size_t) s * a.k_nb2);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            kv[j][i] = key[i * WARP + lane];
        }
    }
    const int mine = b0 + lane / 8;  // the block whose score this lane ends up holding
    for (int t = 0; t < a.n_tps; ++t) {
        float acc = 0.0f;
        for (int h = 0; h < a.n_head; ++h) {
            const float * qrow = (const float *) (a.q + h * a.q_nb1 + t * a.q_nb2 + s * a.q_nb3);
            float         dot[BPW];
#pragma unroll
            for (int j = 0; j < BPW; ++j) {
                dot[j] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const float qi = qrow[i * WARP + lane];
#pragma unroll
                for (int j = 0; j < BPW; ++j) {
                    dot[j] = fmaf(qi, kv[j][i], dot[j]);
                }
            }
            acc += fmaxf(warp_sums4(dot, lane), 0.0f);
        }
        if (lane % 8 == 0 && mine < a.n_blocks) {
            a.dst[((size_t) s * a.n_tps + t) * a.n_blocks + mine] = acc * a.scale;
        }
    }
}

template <int DPL>
void launch(const qsa_score_args & a, int ns, cudaStream_t stream) {
    const dim3 grid((a.n_blocks + WARPS * BPW - 1) / (WARPS * BPW), ns);
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
