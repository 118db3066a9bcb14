// CUDA kernel of PYQSA_GGML_OP_QSA_TOPK, one CTA of 1024 threads per row, in two kernels:
//
// qsa_topk_compact reads the row twice:
//  1. a histogram of the keys' top 11 bits (order-preserving keys, 2048 bins) gives the bin B
//     holding the k-th largest key and the count above it;
//  2. a second pass copies the indices of the keys above B (fewer than k) and the keys and
//     indices of B's keys (the candidates) into shared memory;
//  3. three 7-bit radix passes over the candidates give the k-th key T; the candidates above T
//     are winners, and of those equal to T the lowest indices up to k (a radix select over their
//     indices: exact ties go to the lower index);
//  4. a bitonic sort puts the k winners in increasing index order.
// A row whose candidates do not fit in shared memory (many keys in one bin: long runs of equal
// scores) is flagged, and qsa_topk_radix, the general kernel, does it (and every row of a call
// whose k is over KMAX, or whose rows are over 2^22 long):
//  1. radix select (4 passes of 8 bits over the row in global memory) finds T and how many keys
//     are above it. A warp adds its lanes of one bin with a single atomic (the first pass's bin
//     is the sign and high exponent bits, nearly all scores share one or two, so per-lane
//     atomics would queue on the same address);
//  2. one ordered pass keeps every key > T and the first (k - above) keys == T by index, written
//     in increasing index order with warp ballots (as qsa-mask-cells.cu), matching the CPU kernel.
// At 2048 rows x 65536 blocks (a 2048-token chunk at 256K) on the H200 the op took 2210 us with the
// general kernel alone and 1412 us with both (test-qsa-ops perf, 18a4c7c and 3ac4941).
#include "qsa-topk.cuh"

#include "ordered-key.cuh"

#include <climits>

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;
constexpr int BINS    = 256;    // qsa_topk_radix: 8 bits a pass
constexpr int BINS1   = 2048;   // qsa_topk_compact: the top 11 bits of a key
constexpr int CAP     = 12288;  // candidates held in shared memory (key + index)
constexpr int KMAX    = 1024;   // winners sorted in shared memory

struct smem_t {
    int      hist[BINS1];
    uint32_t cand_key[CAP];
    int      cand_idx[CAP];
    int      eq_idx[CAP];  // the candidates equal to T, by index
    int      sel[KMAX];
    int      n_sel, n_cand, bin1, above, remaining, n_eq;
    uint32_t prefix;
};

// warp 0, over hist's 32 * per_lane bins from the highest down: the bin holding rank `rank`
// (1 = the largest key) and the keys in the bins above it, in every lane
__device__ void find_bin(const int * hist, int per_lane, int rank, int lane, int & bin, int & above) {
    const int top = (31 - lane) * per_lane;  // lane l owns bins top .. top + per_lane - 1
    int       sum = 0;
    for (int j = 0; j < per_lane; ++j) sum += hist[top + j];
    int incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    const int      excl  = incl - sum;
    const unsigned here  = __ballot_sync(0xffffffffu, excl < rank && rank <= incl);
    const int      owner = here ? __ffs(here) - 1 : 31;
    int r = rank - excl, b = per_lane - 1, a = excl;
    for (; b > 0 && hist[top + b] < r; --b) {
        r -= hist[top + b];
        a += hist[top + b];
    }
    bin   = __shfl_sync(0xffffffffu, top + b, owner);
    above = __shfl_sync(0xffffffffu, a, owner);
}

// appends the lanes of a warp whose `take` holds: one atomic a warp, positions in lane order
__device__ __forceinline__ int warp_append(int * counter, bool take, int lane) {
    const unsigned m    = __ballot_sync(0xffffffffu, take);
    int            base = 0;
    if (lane == 0 && m) base = atomicAdd(counter, __popc(m));
    base = __shfl_sync(0xffffffffu, base, 0);
    return base + __popc(m & ((1u << lane) - 1u));
}

// grid (rows), THREADS threads, sizeof(smem_t) bytes of dynamic shared memory; overflow[row]: 1
// when the row's candidates do not fit (the row is left to qsa_topk_radix), else 0
__global__ void __launch_bounds__(THREADS) qsa_topk_compact(const float * score, const int32_t * n_vis, int32_t * dst,
                                                            int * overflow, int n, int k) {
    extern __shared__ __align__(16) char raw[];
    smem_t &      s    = *(smem_t *) raw;
    const int     tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const float * x   = score + (size_t) blockIdx.x * n;
    const int     vis = n_vis ? max(0, min(n, n_vis[blockIdx.x])) : n;
    const auto    key_at = [&](int i) { return ordered_key(i < vis ? x[i] : -INFINITY); };

    // 1. the top-11-bit histogram, and the bin holding the k-th largest key
    for (int b = tid; b < BINS1; b += THREADS) s.hist[b] = 0;
    if (tid == 0) {
        s.n_sel  = 0;
        s.n_cand = 0;
        s.n_eq   = 0;
    }
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += THREADS) {
        const int      i   = i0 + tid;
        const bool     in  = i < n;
        const uint32_t bin = in ? key_at(i) >> 21 : 0u;
        const unsigned act = __ballot_sync(0xffffffffu, in);
        if (in) {
            const unsigned peers = __match_any_sync(act, bin);
            if (lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], __popc(peers));
        }
    }
    __syncthreads();
    if (warp == 0) {
        int bin, above;
        find_bin(s.hist, BINS1 / 32, k, lane, bin, above);
        if (lane == 0) {
            s.bin1  = bin;
            s.above = above;
        }
    }
    __syncthreads();
    const uint32_t bin1 = (uint32_t) s.bin1;
    const int      n_c  = s.hist[bin1];
    const bool over = n_c > CAP;
    if (tid == 0) overflow[blockIdx.x] = over;
    if (over) return;

    // 2. the winners above the bin (fewer than k) and the bin's candidates, into shared memory
    for (int i0 = 0; i0 < n; i0 += THREADS) {
        const int      i   = i0 + tid;
        const uint32_t key = i < n ? key_at(i) : 0u;
        const uint32_t top = key >> 21;
        const bool     sure = i < n && top > bin1, cand = i < n && top == bin1;
        const int      ps = warp_append(&s.n_sel, sure, lane);
        const int      pc = warp_append(&s.n_cand, cand, lane);
        if (sure) s.sel[ps] = i;
        if (cand) {
            s.cand_key[pc] = key;
            s.cand_idx[pc] = i;
        }
    }
    if (tid == 0) {
        s.prefix    = bin1 << 21;
        s.remaining = k - s.above;  // rank of the k-th key among the candidates, from the top
    }
    __syncthreads();

    // 3. three 7-bit radix passes over the candidates' low 21 bits give T
    for (int shift = 14; shift >= 0; shift -= 7) {
        for (int b = tid; b < 128; b += THREADS) s.hist[b] = 0;
        __syncthreads();
        const uint32_t high = 0xffffffffu << (shift + 7);
        for (int j = tid; j < n_c; j += THREADS) {
            const uint32_t key = s.cand_key[j];
            if ((key & high) == s.prefix) atomicAdd(&s.hist[(key >> shift) & 127], 1);
        }
        __syncthreads();
        if (warp == 0) {
            int bin, above;
            find_bin(s.hist, 4, s.remaining, lane, bin, above);
            if (lane == 0) {
                s.prefix |= (uint32_t) bin << shift;
                s.remaining -= above;
            }
        }
        __syncthreads();
    }
    const uint32_t T       = s.prefix;
    const int      take_eq = s.remaining;  // keys == T to keep, the lowest indices first

    // the candidates above T are winners; count those equal to T
    for (int j0 = 0; j0 < n_c; j0 += THREADS) {
        const int  j  = j0 + tid;
        const bool gt = j < n_c && s.cand_key[j] > T;
        const bool eq = j < n_c && s.cand_key[j] == T;
        const int  p  = warp_append(&s.n_sel, gt, lane);
        if (gt) s.sel[p] = s.cand_idx[j];
        const int  q  = warp_append(&s.n_eq, eq, lane);
        if (eq) s.eq_idx[q] = s.cand_idx[j];
    }
    __syncthreads();
    const int n_eq = s.n_eq;

    // of the n_eq ties, the take_eq lowest indices: none, all, or those up to the take_eq-th
    // smallest, found by two 11-bit radix passes over the indices (below 2^22) as the element of
    // rank n_eq - take_eq + 1 from the top
    int cut = -1;
    if (take_eq >= n_eq) {
        cut = INT_MAX;
    } else if (take_eq > 0) {
        if (tid == 0) {
            s.prefix    = 0;
            s.remaining = n_eq - take_eq + 1;
        }
        for (int shift = 11; shift >= 0; shift -= 11) {
            for (int b = tid; b < BINS1; b += THREADS) s.hist[b] = 0;
            __syncthreads();
            const uint32_t high = 0xffffffffu << (shift + 11);
            for (int j = tid; j < n_eq; j += THREADS) {
                const uint32_t v = (uint32_t) s.eq_idx[j];
                if ((v & high) == s.prefix) atomicAdd(&s.hist[(v >> shift) & 2047], 1);
            }
            __syncthreads();
            if (warp == 0) {
                int bin, above;
                find_bin(s.hist, BINS1 / 32, s.remaining, lane, bin, above);
                if (lane == 0) {
                    s.prefix |= (uint32_t) bin << shift;
                    s.remaining -= above;
                }
            }
            __syncthreads();
        }
        cut = (int) s.prefix;
    }
    for (int j0 = 0; j0 < n_eq; j0 += THREADS) {
        const int  j    = j0 + tid;
        const bool keep = j < n_eq && s.eq_idx[j] <= cut;
        const int  p    = warp_append(&s.n_sel, keep, lane);
        if (keep) s.sel[p] = s.eq_idx[j];
    }
    __syncthreads();

    // 4. the k winners in increasing index order: a bitonic sort over the next power of two
    int np = 1;
    while (np < k) np <<= 1;
    for (int j = k + tid; j < np; j += THREADS) s.sel[j] = INT_MAX;
    __syncthreads();
    for (int size = 2; size <= np; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int j = tid; j < np / 2; j += THREADS) {
                const int  lo  = 2 * j - (j & (stride - 1));
                const int  hi  = lo + stride;
                const bool asc = (lo & size) == 0;
                const int  a = s.sel[lo], b = s.sel[hi];
                if ((a > b) == asc) {
                    s.sel[lo] = b;
                    s.sel[hi] = a;
                }
            }
            __syncthreads();
        }
    }
    int32_t * out = dst + (size_t) blockIdx.x * k;
    for (int j = tid; j < k; j += THREADS) out[j] = s.sel[j];
}

// grid (rows), THREADS threads; with `only`, the rows flagged there (the others are done)
__global__ void qsa_topk_radix(const float * score, const int32_t * n_vis, const int * only, int32_t * dst, int n, int k) {
    if (only && !only[blockIdx.x]) return;
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
            int bin, keys_above;
            find_bin(hist, BINS / 32, remaining, threadIdx.x, bin, keys_above);
            if (threadIdx.x == 0) {
                above += keys_above;
                remaining -= keys_above;
                prefix |= (uint32_t) bin << shift;
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

constexpr size_t COMPACT_SMEM = sizeof(smem_t);

void pyqsa_cuda_qsa_topk(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * score = dst->src[0];
    const int       n     = (int) score->ne[0];
    const int       k     = (int) dst->ne[0];
    const int       rows  = (int) ggml_nrows(score);
    const float *   x     = (const float *) score->data;
    const int32_t * n_vis = dst->src[1] ? (const int32_t *) dst->src[1]->data : nullptr;
    int32_t *       out   = (int32_t *) dst->data;
    cudaStream_t    stream = ctx.stream();
    // the compact kernel sorts at most KMAX winners and keeps indices in 22 bits
    const bool compact = k <= KMAX && n <= (1 << 22) &&
                         COMPACT_SMEM <= ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo;
    if (!compact) {
        qsa_topk_radix<<<rows, THREADS, 0, stream>>>(x, n_vis, nullptr, out, n, k);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    ggml_cuda_pool_alloc<int> overflow(ctx.pool(), rows);
    CUDA_SET_SHARED_MEMORY_LIMIT(qsa_topk_compact, COMPACT_SMEM);
    qsa_topk_compact<<<rows, THREADS, COMPACT_SMEM, stream>>>(x, n_vis, out, overflow.get(), n, k);
    CUDA_CHECK(cudaGetLastError());
    qsa_topk_radix<<<rows, THREADS, 0, stream>>>(x, n_vis, overflow.get(), out, n, k);
    CUDA_CHECK(cudaGetLastError());
}
