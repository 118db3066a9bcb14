// CUDA kernel of PYQSA_GGML_OP_QSA_TOPK, CTAs of 1024 threads, in two kernels:
//
// qsa_topk_compact (one CTA a row) reads the row twice:
//  1. a histogram of the keys' top 11 bits (order-preserving keys, 2048 bins) gives the bin B
//     holding the k-th largest key and the count above it;
//  2. a second pass copies the indices of the keys above B (fewer than k) and the keys and
//     indices of B's keys (the candidates) into shared memory;
//  3. three 7-bit radix passes over the candidates give the k-th key T; the candidates above T
//     are winners, and of those equal to T the lowest indices up to k (a radix select over their
//     indices: exact ties go to the lower index);
//  4. a bitonic sort puts the k winners in increasing index order.
// At decode steps of long rows qsa_topk_cluster does the same with a row over a thread-block
// cluster of 8 CTAs: each takes an eighth of the keys through steps 1 and 2, and the first adds
// the histograms and gathers the winners and candidates through distributed shared memory
// before it does steps 3 and 4 (cluster_rows says when).
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

#include <cooperative_groups.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;
constexpr int BINS    = 256;    // qsa_topk_radix: 8 bits a pass
constexpr int BINS1   = 2048;   // qsa_topk_compact: the top 11 bits of a key
constexpr int CAP     = 12288;  // candidates held in shared memory (key + index)
constexpr int KMAX    = 1024;   // winners sorted in shared memory
constexpr int CLUSTER = 8;      // qsa_topk_cluster: CTAs a row

struct smem_t {
    int      hist[BINS1];
    uint32_t cand_key[CAP];
    int      cand_idx[CAP];
    int      eq_idx[CAP];  // the candidates equal to T, by index
    int      sel[KMAX];
    int      n_sel, n_cand, bin1, above, remaining, n_eq;
    uint32_t prefix;
    int      sel_at[CLUSTER + 1], cand_at[CLUSTER + 1];  // qsa_topk_cluster: where share q's entries go
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

// a row's key i: scores at or past vis count as -inf
__device__ __forceinline__ uint32_t key_at(const float * x, int vis, int i) {
    return ordered_key(i < vis ? x[i] : -INFINITY);
}

// 1a. over keys [i_beg, i_end) of x: s's counters zeroed, the keys' top-11-bit histogram
__device__ void hist_pass(smem_t & s, const float * x, int vis, int i_beg, int i_end) {
    const int tid = threadIdx.x, lane = tid % 32;
    for (int b = tid; b < BINS1; b += THREADS) s.hist[b] = 0;
    if (tid == 0) {
        s.n_sel  = 0;
        s.n_cand = 0;
        s.n_eq   = 0;
    }
    __syncthreads();
    for (int i0 = i_beg; i0 < i_end; i0 += THREADS) {
        const int      i   = i0 + tid;
        const bool     in  = i < i_end;
        const uint32_t bin = in ? key_at(x, vis, i) >> 21 : 0u;
        const unsigned act = __ballot_sync(0xffffffffu, in);
        if (in) {
            const unsigned peers = __match_any_sync(act, bin);
            if (lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], __popc(peers));
        }
    }
}

// 1b. the bin of s.hist holding the k-th largest key, and the keys above it: s.bin1, s.above
__device__ void choose_bin(smem_t & s, int k) {
    const int lane = threadIdx.x % 32;
    __syncthreads();
    if (threadIdx.x / 32 == 0) {
        int bin, above;
        find_bin(s.hist, BINS1 / 32, k, lane, bin, above);
        if (lane == 0) {
            s.bin1  = bin;
            s.above = above;
        }
    }
    __syncthreads();
}

// 2. over keys [i_beg, i_end) of x: the winners above bin1 (fewer than k) and the candidates in
// it, appended to s
__device__ void collect_pass(smem_t & s, const float * x, int vis, int i_beg, int i_end, uint32_t bin1) {
    const int lane = threadIdx.x % 32;
    for (int i0 = i_beg; i0 < i_end; i0 += THREADS) {
        const int      i    = i0 + threadIdx.x;
        const uint32_t key  = i < i_end ? key_at(x, vis, i) : 0u;
        const uint32_t top  = key >> 21;
        const bool     sure = i < i_end && top > bin1, cand = i < i_end && top == bin1;
        const int      ps   = warp_append(&s.n_sel, sure, lane);
        const int      pc   = warp_append(&s.n_cand, cand, lane);
        if (sure) s.sel[ps] = i;
        if (cand) {
            s.cand_key[pc] = key;
            s.cand_idx[pc] = i;
        }
    }
}

// 3-4. by a CTA holding all n_c candidates (bin1's keys) and the winners above bin1 (s.n_sel of
// them, s.above keys): the row's k winners in increasing index order, into out
__device__ void finish(smem_t & s, uint32_t bin1, int n_c, int k, int32_t * out) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
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
    for (int j = tid; j < k; j += THREADS) out[j] = s.sel[j];
}

// grid (rows), THREADS threads, sizeof(smem_t) bytes of dynamic shared memory; overflow[row]: 1
// when the row's candidates do not fit (the row is left to qsa_topk_radix), else 0
__global__ void __launch_bounds__(THREADS) qsa_topk_compact(const float * score, const int32_t * n_vis, int32_t * dst,
                                                            int * overflow, int n, int k) {
    extern __shared__ __align__(16) char raw[];
    smem_t &      s   = *(smem_t *) raw;
    const float * x   = score + (size_t) blockIdx.x * n;
    const int     vis = n_vis ? max(0, min(n, n_vis[blockIdx.x])) : n;
    hist_pass(s, x, vis, 0, n);
    choose_bin(s, k);
    const uint32_t bin1 = (uint32_t) s.bin1;
    const int      n_c  = s.hist[bin1];
    const bool     over = n_c > CAP;
    if (threadIdx.x == 0) overflow[blockIdx.x] = over;
    if (over) return;
    collect_pass(s, x, vis, 0, n, bin1);
    finish(s, bin1, n_c, k, dst + (size_t) blockIdx.x * k);
}

// A row over a thread-block cluster needs sm_90's distributed shared memory; elsewhere the
// cluster kernel is never launched (cluster_rows)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
#    define PYQSA_TOPK_CLUSTERS 1
#else
#    define PYQSA_TOPK_CLUSTERS 0
#endif

// grid (rows * CLUSTER), clusters of CLUSTER CTAs along x, THREADS threads, sizeof(smem_t) bytes
// of dynamic shared memory: CTA r of row blockIdx.x / CLUSTER takes keys [r n / CLUSTER,
// (r + 1) n / CLUSTER), their histogram (1a) and their winners and candidates (2). The first CTA
// adds the histograms and picks the bin, gathers the others' winners and candidates after its own
// through distributed shared memory, and finishes (3-4): the same counts, candidates and rules as
// qsa_topk_compact, so the same selection. overflow[row] as there.
__global__ void __launch_bounds__(THREADS) qsa_topk_cluster(const float * score, const int32_t * n_vis, int32_t * dst,
                                                            int * overflow, int n, int k) {
#if PYQSA_TOPK_CLUSTERS
    namespace cg = cooperative_groups;
    extern __shared__ __align__(16) char raw[];
    smem_t &          s       = *(smem_t *) raw;
    cg::cluster_group cluster = cg::this_cluster();
    const int         r       = (int) cluster.block_rank();
    const int         row     = blockIdx.x / CLUSTER;
    const int         tid     = threadIdx.x;
    const float *     x       = score + (size_t) row * n;
    const int         vis     = n_vis ? max(0, min(n, n_vis[row])) : n;
    const int i_beg = (int) ((long long) n * r / CLUSTER), i_end = (int) ((long long) n * (r + 1) / CLUSTER);
    hist_pass(s, x, vis, i_beg, i_end);
    cluster.sync();  // every share's histogram is done
    if (r == 0) {
        for (int b = tid; b < BINS1; b += THREADS) {
            int sum = s.hist[b];
            for (int q = 1; q < CLUSTER; ++q) sum += cluster.map_shared_rank(&s, q)->hist[b];
            s.hist[b] = sum;
        }
        choose_bin(s, k);
        if (tid == 0) overflow[row] = s.hist[s.bin1] > CAP;
    }
    cluster.sync();  // the bin is known
    const smem_t & s0   = *cluster.map_shared_rank(&s, 0);
    const uint32_t bin1 = (uint32_t) s0.bin1;
    const int      n_c  = s0.hist[bin1];
    if (n_c > CAP) {
        cluster.sync();  // no CTA leaves before all have read the first one's shared memory
        return;
    }
    collect_pass(s, x, vis, i_beg, i_end, bin1);
    cluster.sync();  // every share's winners and candidates are collected
    if (r == 0) {    // share q's entries after those of shares 0 .. q - 1
        if (tid == 0) {
            s.sel_at[1]  = s.n_sel;
            s.cand_at[1] = s.n_cand;
            for (int q = 1; q < CLUSTER; ++q) {
                const smem_t * o = cluster.map_shared_rank(&s, q);
                s.sel_at[q + 1]  = s.sel_at[q] + o->n_sel;
                s.cand_at[q + 1] = s.cand_at[q] + o->n_cand;
            }
        }
        __syncthreads();
        for (int q = 1; q < CLUSTER; ++q) {
            const smem_t * o = cluster.map_shared_rank(&s, q);
            for (int j = tid; j < s.sel_at[q + 1] - s.sel_at[q]; j += THREADS) s.sel[s.sel_at[q] + j] = o->sel[j];
            for (int j = tid; j < s.cand_at[q + 1] - s.cand_at[q]; j += THREADS) {
                s.cand_key[s.cand_at[q] + j] = o->cand_key[j];
                s.cand_idx[s.cand_at[q] + j] = o->cand_idx[j];
            }
        }
        __syncthreads();
        if (tid == 0) {
            s.n_sel  = s.sel_at[CLUSTER];
            s.n_cand = s.cand_at[CLUSTER];
        }
    }
    cluster.sync();  // the others' shared memory is read: they may leave
    if (r == 0) finish(s, bin1, n_c, k, dst + (size_t) row * k);
#else
    GGML_UNUSED_VARS(score, n_vis, dst, overflow, n, k);
    NO_DEVICE_CODE;
#endif
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

constexpr size_t COMPACT_SMEM = sizeof(smem_t);

// a launch of qsa_topk_cluster over `rows` rows (the attribute kept beside the config that points at it)
struct cluster_launch {
    cudaLaunchAttribute attr = {};
    cudaLaunchConfig_t  cfg  = {};

    cluster_launch(int rows, cudaStream_t stream) {
        attr.id               = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = CLUSTER;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.gridDim           = dim3(rows * CLUSTER);
        cfg.blockDim          = dim3(THREADS);
        cfg.dynamicSmemBytes  = COMPACT_SMEM;
        cfg.stream            = stream;
        cfg.attrs             = &attr;
        cfg.numAttrs          = 1;
    }

    cluster_launch(const cluster_launch &)             = delete;
    cluster_launch & operator=(const cluster_launch &) = delete;
};

// NOTE: a row over a cluster of CLUSTER CTAs where a launch of one cluster a row fits the device
// at once (decode steps: up to 16 rows on an H100) and the row has 32768 keys or more (a 128K
// context at ratio 4). One CTA's histogram and collection go at ~0.5 us per 1024 keys whatever
// the loads (one SM's shared-memory atomics); at 65536 keys a row (256K) the cluster took 40.1 us
// a call for 1 or 8 rows against 67.5 for one CTA, at 8192 keys (32K) 24.5 against 20.2, the
// merge's fixed cost (native/dev/README.md, qsa-topk-decode, one H100). PYQSA_CUDA_TOPK_ONE_CTA=1
// keeps every row on one CTA (the same selection). The most rows a cluster launch may have; 0:
// none (before sm_90, or code not built for it: a JIT of older PTX, where the kernel is empty).
int cluster_rows(int device) {
    const char * env = std::getenv("PYQSA_CUDA_TOPK_ONE_CTA");
    if (env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0) {
        return 0;
    }
    static int  rows[GGML_CUDA_MAX_DEVICES]  = {};
    static bool known[GGML_CUDA_MAX_DEVICES] = {};
    if (!known[device]) {
        known[device]           = true;
        const auto &       info = ggml_cuda_info().devices[device];
        cudaFuncAttributes attr = {};
        CUDA_CHECK(cudaFuncGetAttributes(&attr, qsa_topk_cluster));
        if (info.cc >= GGML_CUDA_CC_HOPPER && attr.ptxVersion >= 90 && COMPACT_SMEM <= info.smpbo) {
            CUDA_SET_SHARED_MEMORY_LIMIT(qsa_topk_cluster, COMPACT_SMEM);
            const cluster_launch l(1, nullptr);
            if (cudaOccupancyMaxActiveClusters(&rows[device], qsa_topk_cluster, &l.cfg) != cudaSuccess) {
                rows[device] = 0;
                (void) cudaGetLastError();  // a refused query leaves every row on one CTA
            }
        }
    }
    return rows[device];
}

}  // namespace

void pyqsa_cuda_qsa_topk(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * score = dst->src[0];
    const int       n     = (int) score->ne[0];
    const int       k     = (int) dst->ne[0];
    const int       rows  = (int) ggml_nrows(score);
    const float *   x     = (const float *) score->data;
    const int32_t * n_vis = dst->src[1] ? (const int32_t *) dst->src[1]->data : nullptr;
    int32_t *       out   = (int32_t *) dst->data;
    cudaStream_t    stream = ctx.stream();
    // the compact kernels sort at most KMAX winners and keep indices in 22 bits
    const bool compact = k <= KMAX && n <= (1 << 22) &&
                         COMPACT_SMEM <= ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo;
    if (!compact) {
        qsa_topk_radix<<<rows, THREADS, 0, stream>>>(x, n_vis, nullptr, out, n, k);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    ggml_cuda_pool_alloc<int> overflow(ctx.pool(), rows);
    if (n >= 32768 && rows <= cluster_rows(ctx.device)) {
        const cluster_launch l(rows, stream);
        CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, qsa_topk_cluster, x, n_vis, out, overflow.get(), n, k));
    } else {
        CUDA_SET_SHARED_MEMORY_LIMIT(qsa_topk_compact, COMPACT_SMEM);
        qsa_topk_compact<<<rows, THREADS, COMPACT_SMEM, stream>>>(x, n_vis, out, overflow.get(), n, k);
        CUDA_CHECK(cudaGetLastError());
    }
    qsa_topk_radix<<<rows, THREADS, 0, stream>>>(x, n_vis, overflow.get(), out, n, k);
    CUDA_CHECK(cudaGetLastError());
}
