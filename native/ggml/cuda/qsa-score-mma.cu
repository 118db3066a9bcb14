// QSA_SCORE on tensor cores, for prefill chunks (many queries per stream):
//   score[b, t, s] = scale * sum over h of ReLU(q[:, h, t, s] . keys[:, b, s])
// in one pass, so the [n_blocks, n_head, n_tps] product of a chunk (2 GiB for 2048 queries at
// 256K) never reaches memory.
//
// f32 where the reference is f32: q and the keys are each split into f16 hi + lo (x = hi + lo to
// about 2^-22 relative) and q . k = qh kh + qh kl + ql kh with f32 accumulators (ql kl, ~2^-22 of
// a term, is dropped). The scores carry f32-level rounding, not the CPU's bits (test-qsa-ops
// compares them); identical keys still get identical scores, so exact ties stay ties.
//
// A CTA takes TQ = 16 queries of one stream, all NH heads (m-tile h is head h, its rows the
// queries), and one tile of TB blocks; each of its 4 warps owns NT n-tiles of 8 blocks. A thread
// so holds every head of the same (query, block) entries and adds their ReLUs in head order in
// registers. Studied against cuBLAS's f32 product + head sum in native/dev (197187a): 2731 us
// against 4437 us for 2048 queries x 65536 blocks (D = 128, NH = 4) on the H200.
#include "qsa-score-mma.cuh"

#include "mma-ptx.cuh"

using namespace pyqsa_mma;

namespace {

constexpr int TQ      = 16;  // queries of a CTA: the M of each head's m-tile
constexpr int WARPS   = 4;
constexpr int THREADS = WARPS * 32;

template <int D, int NH> struct shape {
    static constexpr int    NT       = NH <= 4 ? 4 : 2;            // n-tiles of 8 blocks per warp
    static constexpr int    TB       = WARPS * NT * 8;             // blocks of a tile
    static constexpr size_t Q_HALVES = (size_t) NH * TQ * D;       // per hi / lo
    static constexpr size_t K_HALVES = (size_t) TB * D;            // per hi / lo
    static constexpr size_t bytes    = 2 * (Q_HALVES + K_HALVES) * sizeof(half);
};

// chunk c of row r of a [rows][D] half matrix lives at c ^ (r % 8) (r % 4 for D = 32): the 8 rows
// one ldmatrix reads at one chunk fall in different bank groups
template <int D> __device__ __forceinline__ int swz(int r, int chunk) {
    constexpr int mask = (D / 8 < 8 ? D / 8 : 8) - 1;
    return r * D + ((chunk ^ (r & mask)) << 3);
}

__device__ __forceinline__ void split4(const float4 x, half * hi, half * lo) {
    const float v[4] = { x.x, x.y, x.z, x.w };
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const half h = __float2half_rn(v[i]);
        hi[i]        = h;
        lo[i]        = __float2half_rn(v[i] - __half2float(h));
    }
}

// grid (ceil(n_blocks / TB), ceil(n_tps / TQ), ns), THREADS threads
template <int D, int NH>
__global__ void __launch_bounds__(THREADS) qsa_score_mma(const qsa_score_args a) {
#if __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
    using S = shape<D, NH>;
    constexpr int NT = S::NT;
    extern __shared__ __align__(16) char smem[];
    half * q_hi = (half *) smem;
    half * q_lo = q_hi + S::Q_HALVES;
    half * k_hi = q_lo + S::Q_HALVES;
    half * k_lo = k_hi + S::K_HALVES;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t4 = lane % 4;  // fragment row and column pair
    const int b0 = blockIdx.x * S::TB, t0 = blockIdx.y * TQ, s = blockIdx.z;

    // the CTA's queries, head h's rows at q_hi + h * TQ * D; rows past n_tps zero
    for (int i = tid; i < NH * TQ * (D / 4); i += THREADS) {
        const int    f4 = i % (D / 4), r = (i / (D / 4)) % TQ, h = i / (D / 4) / TQ;
        const float4 x  = t0 + r < a.n_tps ? ((const float4 *) (a.q + h * a.q_nb1 + (size_t) (t0 + r) * a.q_nb2 +
                                                                (size_t) s * a.q_nb3))[f4]
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const int    o  = h * TQ * D + swz<D>(r, f4 / 2) + (f4 % 2) * 4;
        split4(x, q_hi + o, q_lo + o);
    }
    // the tile's block keys; blocks past n_blocks zero
    for (int i = tid; i < S::TB * (D / 4); i += THREADS) {
        const int    f4 = i % (D / 4), r = i / (D / 4);
        const float4 x  = b0 + r < a.n_blocks
                              ? ((const float4 *) (a.keys + (size_t) (b0 + r) * a.k_nb1 + (size_t) s * a.k_nb2))[f4]
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const int    o  = swz<D>(r, f4 / 2) + (f4 % 2) * 4;
        split4(x, k_hi + o, k_lo + o);
    }
    __syncthreads();

    float acc[NH][NT][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) {
        // B: this warp's n-tiles over k = kk*32 .. kk*32 + 31 (regs 0,1: first k-step; 2,3: second)
        uint32_t bh[NT][4], bl[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int r = warp * NT * 8 + j * 8 + lane % 8;
            ldmatrix_x4(bh[j], k_hi + swz<D>(r, kk * 4 + lane / 8));
            ldmatrix_x4(bl[j], k_lo + swz<D>(r, kk * 4 + lane / 8));
        }
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                uint32_t  ah[4], al[4];
                const int ch = (kk * 2 + ks) * 2 + lane / 16;
                ldmatrix_x4(ah, q_hi + h * TQ * D + swz<D>(lane % 16, ch));
                ldmatrix_x4(al, q_lo + h * TQ * D + swz<D>(lane % 16, ch));
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    mma_f16(acc[h][j], ah, bh[j][2 * ks], bh[j][2 * ks + 1]);
                    mma_f16(acc[h][j], ah, bl[j][2 * ks], bl[j][2 * ks + 1]);
                    mma_f16(acc[h][j], al, bh[j][2 * ks], bh[j][2 * ks + 1]);
                }
            }
        }
    }

    // rows g and g + 8 (queries), columns 2 t4 and 2 t4 + 1 of each n-tile (blocks)
    float * out = a.dst + (size_t) s * a.n_tps * a.n_blocks;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int b = b0 + warp * NT * 8 + j * 8 + 2 * t4;
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int t = t0 + g + 8 * half_row;
            if (t >= a.n_tps) {
                continue;
            }
            float v[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float sum = 0.0f;
#pragma unroll
                for (int h = 0; h < NH; ++h) {
                    sum += fmaxf(acc[h][j][2 * half_row + c], 0.0f);
                }
                v[c] = sum * a.scale;
            }
            float * o = out + (size_t) t * a.n_blocks + b;
            if (a.n_blocks % 2 == 0 && b + 1 < a.n_blocks) {  // with even rows b stays even: 8-byte aligned
                *(float2 *) o = make_float2(v[0], v[1]);
            } else {
                for (int c = 0; c < 2 && b + c < a.n_blocks; ++c) {
                    o[c] = v[c];
                }
            }
        }
    }
#else
    GGML_UNUSED(a);
    NO_DEVICE_CODE;
#endif
}

template <int D, int NH> void launch(ggml_backend_cuda_context & ctx, const qsa_score_args & a, int ns) {
    using S = shape<D, NH>;
    static bool raised[GGML_CUDA_MAX_DEVICES] = {};
    if (!raised[ctx.device]) {
        CUDA_CHECK(cudaFuncSetAttribute(qsa_score_mma<D, NH>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int) S::bytes));
        raised[ctx.device] = true;
    }
    const dim3 grid((a.n_blocks + S::TB - 1) / S::TB, (a.n_tps + TQ - 1) / TQ, ns);
    qsa_score_mma<D, NH><<<grid, THREADS, S::bytes, ctx.stream()>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

template <int D> bool by_heads(ggml_backend_cuda_context & ctx, const qsa_score_args & a, int ns) {
    switch (a.n_head) {
        case 1: launch<D, 1>(ctx, a, ns); return true;
        case 2: launch<D, 2>(ctx, a, ns); return true;
        case 4: launch<D, 4>(ctx, a, ns); return true;
        case 8:
            if constexpr (D <= 128) {
                launch<D, 8>(ctx, a, ns);
                return true;
            }
            return false;
        default: return false;
    }
}

}  // namespace

bool pyqsa_cuda_qsa_score_mma(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, const qsa_score_args & a) {
    const ggml_tensor * q    = dst->src[0];  // [D, n_head, n_tps, ns]
    const ggml_tensor * keys = dst->src[1];  // [D, n_blocks, ns]
    const size_t align = (size_t) (uintptr_t) q->data | (size_t) (uintptr_t) keys->data | q->nb[1] | q->nb[2] |
                         q->nb[3] | keys->nb[1] | keys->nb[2];
    if (q->ne[2] < PYQSA_GGML_QSA_SCORE_CUDA_MMA_MIN_TPS || keys->ne[1] == 0 || align % 16 != 0 || q->ne[3] > 65535 ||
        (q->ne[2] + TQ - 1) / TQ > 65535 || ggml_cuda_info().devices[ctx.device].cc < GGML_CUDA_CC_AMPERE) {
        return false;
    }
    const int ns = (int) q->ne[3];
    switch (q->ne[0]) {
        case 32:  return by_heads<32>(ctx, a, ns);
        case 64:  return by_heads<64>(ctx, a, ns);
        case 128: return by_heads<128>(ctx, a, ns);
        case 256: return by_heads<256>(ctx, a, ns);
        default:  return false;
    }
}
