// CUDA kernel of PYQSA_GGML_OP_QSA_TOPK, one CTA per row:
//  1. radix select (4 passes of 8 bits over order-preserving keys) finds the k-th largest key T
//     and how many keys are above it. A warp adds its lanes of one bin with a single atomic
//     (the first pass's bin is the sign and high exponent bits, nearly all scores share one or
//     two, so per-lane atomics would queue on the same address), and warp 0 finds the bin
//     holding the remaining rank with a suffix scan over its lanes' 8 bins each;
//  2. one ordered pass keeps every key > T and the first (k - above) keys == T by index, written
//     in increasing index order with warp ballots (as qsa-mask-cells.cu), matching the CPU kernel.
#include "qsa-topk.cuh"

#include "ordered-key.cuh"

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;
constexpr int BINS    = 256;

__global__ void qsa_topk(const float * score, const int32_t * n_vis, int32_t * dst, int n, int k) {
    const float * x   = score + (size_t) blockIdx.x * n;
    int32_t *     out = dst + (size_t) blockIdx.x * k;
    // entries at or past vis count as -inf
    const int vis = n_vis ? max(0, min(n, n_vis[blockIdx.x])) : n;

    __shared__ int      hist[BINS];
    __shared__ uint32_t prefix;      // high bits of T fixed so far
    __shared__ int      remaining;   // rank of T among keys that match the prefix
    __shared__ int      above;       // keys strictly greater than T
    __shared__ int      eq_count[WARPS];
    __shared__ int      keep_count[WARPS];
    __shared__ int      base_gt, base_eq;

    if (threadIdx.x == 0) {
        prefix    = 0;
        remaining = k;
        above     = 0;
    }
    __syncthreads();

    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < BINS; b += THREADS) {
            hist[b] = 0;
        }
        __syncthreads();
        const uint32_t high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int i0 = 0; i0 < n; i0 += THREADS) {  // the same trip count in every thread
            const int      i      = i0 + threadIdx.x;
            const uint32_t key    = ordered_key(i < vis ? x[i] : -INFINITY);
            const bool     counts = i < n && (key & high_mask) == prefix;
            const uint32_t bin    = (key >> shift) & 0xff;
            const unsigned active = __ballot_sync(0xffffffff, counts);
            if (counts) {
                const unsigned peers = __match_any_sync(active, bin);
                if (threadIdx.x % 32 == __ffs(peers) - 1) {
                    atomicAdd(&hist[bin], __popc(peers));
                }
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // the bin where the remaining rank falls, counting from the top: lane l owns bins
            // 8l .. 8l+7; excl counts the keys in the bins of the lanes above it
            constexpr int PER_LANE = BINS / 32;
            const int     lane     = threadIdx.x;
            int           c[PER_LANE];
            int           sum = 0;
            for (int j = 0; j < PER_LANE; ++j) {
                c[j] = hist[lane * PER_LANE + j];
                sum += c[j];
            }
            int incl = sum;
            for (int off = 1; off < 32; off <<= 1) {
                const int v = __shfl_down_sync(0xffffffff, incl, off);
                incl += lane + off < 32 ? v : 0;
            }
            const int      excl  = incl - sum;
            const int      rank  = remaining;
            const unsigned here  = __ballot_sync(0xffffffff, excl < rank && rank <= incl);
            // no lane holds it only when fewer keys match than the rank: bin 0 then, as a walk
            // from the top would end
            const int      owner = here ? __ffs(here) - 1 : 0;
            if (lane == owner) {
                int r = rank - excl, b = PER_LANE - 1;
                for (; b > 0 && c[b] < r; --b) {
                    r -= c[b];
                }
                above += rank - r;
                remaining = r;
                prefix |= (uint32_t) (lane * PER_LANE + b) << shift;
            }
        }
        __syncthreads();
    }

    const uint32_t T       = prefix;
    const int      take_eq = k - above;  // ties at T to keep, lowest indices first
    const int      warp    = threadIdx.x / 32;
    const int      lane    = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        base_gt = 0;  // kept so far (output position)
        base_eq = 0;  // keys == T seen so far
    }
    __syncthreads();

    for (int i0 = 0; i0 < n; i0 += THREADS) {
        const int      i   = i0 + threadIdx.x;
        const uint32_t key = i < n ? ordered_key(i < vis ? x[i] : -INFINITY) : 0u;
        const bool     eq  = i < n && key == T;
        const unsigned eq_ballot = __ballot_sync(0xffffffff, eq);
        if (lane == 0) {
            eq_count[warp] = __popc(eq_ballot);
        }
        __syncthreads();
        int eq_rank = base_eq + __popc(eq_ballot & ((1u << lane) - 1));
        for (int w = 0; w < warp; ++w) {
            eq_rank += eq_count[w];
        }
        const bool     keep        = i < n && (key > T || (eq && eq_rank < take_eq));
        const unsigned keep_ballot = __ballot_sync(0xffffffff, keep);
        if (lane == 0) {
            keep_count[warp] = __popc(keep_ballot);
        }
        __syncthreads();
        int pos = base_gt + __popc(keep_ballot & ((1u << lane) - 1));
        for (int w = 0; w < warp; ++w) {
            pos += keep_count[w];
        }
        if (keep) {
            out[pos] = i;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 0; w < WARPS; ++w) {
                base_eq += eq_count[w];
                base_gt += keep_count[w];
            }
        }
        __syncthreads();
    }
}

}  // namespace

void pyqsa_cuda_qsa_topk(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * score = dst->src[0];
    const int n    = (int) score->ne[0];
    const int k    = (int) dst->ne[0];
    const int rows = (int) ggml_nrows(score);
    const int32_t * n_vis = dst->src[1] ? (const int32_t *) dst->src[1]->data : nullptr;
    qsa_topk<<<rows, THREADS, 0, ctx.stream()>>>((const float *) score->data, n_vis, (int32_t *) dst->data, n, k);
    CUDA_CHECK(cudaGetLastError());
}
