// Dev corner (see README.md here): qsa_topk at decode steps, 1 and 8 rows of 65536 block scores
// (a 256K context at Flash-Next's ratio of 4) and of 8192 (32K), k = 512. NOT yet run on a GPU.
//
// The 8 x 256K kernel profile (bench/results/2026-12-06-8f17d63-kernels.txt) has qsa_topk_compact
// at 81.6 us a call (0.98 ms a step), and 70.9 us at one row (0.85 ms of a 7.05 ms step), for
// 256 KB of scores a row. The library's kernel (native/ggml/cuda/qsa-topk.cu) gives a row one CTA
// of 1024 threads; loading its keys ahead changed nothing (the earlier qsa-topk-decode study,
// bench/results/2026-12-06-febaa7a-qsa-topk-decode.txt): each pass costs ~0.5 us per 1024 keys of
// one SM's shared-memory atomics, whatever the row count.
//   A       the library's qsa_topk_compact (copied: the dev corner is standalone).
//   C8, C16 a row over a thread-block cluster of 8 or 16 CTAs (16: the non-portable size), each
//           CTA a contiguous share of the keys: its own histogram, which the first CTA adds up
//           from the others' shared memory (distributed shared memory) to find the bin; each CTA
//           then collects its share's winners above the bin and candidates in it, which the first
//           CTA gathers into its own arrays and finishes as A does (the radix passes over the
//           candidates, the ties, the sort). The same counts, candidates and rules: the same
//           selection.
// Each variant is checked against a CPU reference (the k largest, exact ties to the lower index,
// in increasing index order), then timed in CUDA graphs of 20 calls; a failed check ends the study.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda native/dev/qsa-topk-decode.cu -o /tmp/qsa-topk-decode && /tmp/qsa-topk-decode
#include "cuda-check.cuh"
#include "ordered-key.cuh"  // native/ggml/cuda: -Inative/ggml/cuda

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int THREADS = 1024;
constexpr int BINS1   = 2048;   // the top 11 bits of a key
constexpr int CAP     = 12288;  // candidates held in shared memory
constexpr int KMAX    = 1024;

struct smem_t {
    int      hist[BINS1];
    uint32_t cand_key[CAP];
    int      cand_idx[CAP];
    int      eq_idx[CAP];
    int      sel[KMAX];
    int      n_sel, n_cand, bin1, above, remaining, n_eq;
    uint32_t prefix;
};

__device__ void find_bin(const int * hist, int per_lane, int rank, int lane, int & bin, int & above) {
    const int top = (31 - lane) * per_lane;
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

__device__ __forceinline__ int warp_append(int * counter, bool take, int lane) {
    const unsigned m    = __ballot_sync(0xffffffffu, take);
    int            base = 0;
    if (lane == 0 && m) base = atomicAdd(counter, __popc(m));
    base = __shfl_sync(0xffffffffu, base, 0);
    return base + __popc(m & ((1u << lane) - 1u));
}

__device__ __forceinline__ void hist_add(smem_t & s, bool in, uint32_t bin, int lane) {
    const unsigned act = __ballot_sync(0xffffffffu, in);
    if (in) {
        const unsigned peers = __match_any_sync(act, bin);
        if (lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], __popc(peers));
    }
}

__device__ __forceinline__ void collect(smem_t & s, int i, bool in, uint32_t key, uint32_t bin1, int lane) {
    const uint32_t top  = key >> 21;
    const bool     sure = in && top > bin1, cand = in && top == bin1;
    const int      ps   = warp_append(&s.n_sel, sure, lane);
    const int      pc   = warp_append(&s.n_cand, cand, lane);
    if (sure) s.sel[ps] = i;
    if (cand) {
        s.cand_key[pc] = key;
        s.cand_idx[pc] = i;
    }
}

// steps 3-4 of the library's kernel, by the CTA holding every candidate (n_c of them, in bin1) and
// the winners above bin1 (s.n_sel), the rank of the k-th key below bin1 in s.above; writes row's k
// indices in increasing order to out
__device__ void finish(smem_t & s, uint32_t bin1, int n_c, int k, int32_t * out) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (tid == 0) {
        s.prefix    = bin1 << 21;
        s.remaining = k - s.above;
    }
    __syncthreads();

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
    const int      take_eq = s.remaining;
    for (int j0 = 0; j0 < n_c; j0 += THREADS) {
        const int  j  = j0 + tid;
        const bool gt = j < n_c && s.cand_key[j] > T;
        const bool eq = j < n_c && s.cand_key[j] == T;
        const int  p  = warp_append(&s.n_sel, gt, lane);
        if (gt) s.sel[p] = s.cand_idx[j];
        const int q = warp_append(&s.n_eq, eq, lane);
        if (eq) s.eq_idx[q] = s.cand_idx[j];
    }
    __syncthreads();
    const int n_eq = s.n_eq;
    int       cut  = -1;
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

// step 1 over keys [i_beg, i_end) of x: s's counters zeroed, the top-11-bit histogram of the keys
__device__ void hist_pass(smem_t & s, const float * x, int i_beg, int i_end) {
    const int tid = threadIdx.x, lane = tid % 32;
    for (int b = tid; b < BINS1; b += THREADS) s.hist[b] = 0;
    if (tid == 0) {
        s.n_sel  = 0;
        s.n_cand = 0;
        s.n_eq   = 0;
    }
    __syncthreads();
    for (int i0 = i_beg; i0 < i_end; i0 += THREADS) {
        const int i = i0 + tid;
        hist_add(s, i < i_end, i < i_end ? ordered_key(x[i]) >> 21 : 0u, lane);
    }
}

// the bin of s.hist holding the k-th largest key, and the keys above it, into s.bin1 and s.above
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

// step 2 over keys [i_beg, i_end) of x: the winners above bin1 and the candidates in it, into s
__device__ void collect_pass(smem_t & s, const float * x, int i_beg, int i_end, uint32_t bin1) {
    const int lane = threadIdx.x % 32;
    for (int i0 = i_beg; i0 < i_end; i0 += THREADS) {
        const int i = i0 + threadIdx.x;
        collect(s, i, i < i_end, i < i_end ? ordered_key(x[i]) : 0u, bin1, lane);
    }
}

// A: grid (rows), THREADS threads, the library's kernel
__global__ void __launch_bounds__(THREADS) topk_one(const float * score, int32_t * dst, int * overflow, int n, int k) {
    extern __shared__ __align__(16) char raw[];
    smem_t &      s    = *(smem_t *) raw;
    const float * x   = score + (size_t) blockIdx.x * n;
    hist_pass(s, x, 0, n);
    choose_bin(s, k);
    const uint32_t bin1 = (uint32_t) s.bin1;
    const int      n_c  = s.hist[bin1];
    const bool     over = n_c > CAP;
    if (threadIdx.x == 0) overflow[blockIdx.x] = over;
    if (over) return;
    collect_pass(s, x, 0, n, bin1);
    finish(s, bin1, n_c, k, dst + (size_t) blockIdx.x * k);
}

// C: grid (rows * S), clusters of S along x, THREADS threads: CTA r of row blockIdx.x / S takes
// keys [r n / S, (r + 1) n / S)
__global__ void __launch_bounds__(THREADS) topk_cluster(const float * score, int32_t * dst, int * overflow, int n, int k) {
    namespace cg = cooperative_groups;
    extern __shared__ __align__(16) char raw[];
    smem_t &            s       = *(smem_t *) raw;
    cg::cluster_group   cluster = cg::this_cluster();
    const int           S = (int) cluster.num_blocks(), r = (int) cluster.block_rank();
    const int           row = blockIdx.x / S;
    const int           tid = threadIdx.x;
    const float *       x   = score + (size_t) row * n;
    const int           i_beg = (int) ((long long) n * r / S), i_end = (int) ((long long) n * (r + 1) / S);
    hist_pass(s, x, i_beg, i_end);
    cluster.sync();  // every share's histogram is done
    if (r == 0) {    // the row's histogram, in the first CTA's
        for (int b = tid; b < BINS1; b += THREADS) {
            int sum = s.hist[b];
            for (int q = 1; q < S; ++q) sum += cluster.map_shared_rank(&s, q)->hist[b];
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
        cluster.sync();  // (the first CTA's shared memory read by all before any leaves)
        return;
    }
    collect_pass(s, x, i_beg, i_end, bin1);
    cluster.sync();  // every share's winners and candidates are collected
    if (r == 0) {    // the others' appended after the first CTA's own, share by share
        __shared__ int sel_at[17], cand_at[17];  // where share q's entries go; [S]: the totals
        if (tid == 0) {
            sel_at[1]  = s.n_sel;
            cand_at[1] = s.n_cand;
            for (int q = 2; q <= S; ++q) {
                const smem_t * o = cluster.map_shared_rank(&s, q - 1);
                sel_at[q]        = sel_at[q - 1] + o->n_sel;
                cand_at[q]       = cand_at[q - 1] + o->n_cand;
            }
        }
        __syncthreads();
        for (int q = 1; q < S; ++q) {
            const smem_t * o = cluster.map_shared_rank(&s, q);
            for (int j = tid; j < sel_at[q + 1] - sel_at[q]; j += THREADS) s.sel[sel_at[q] + j] = o->sel[j];
            for (int j = tid; j < cand_at[q + 1] - cand_at[q]; j += THREADS) {
                s.cand_key[cand_at[q] + j] = o->cand_key[j];
                s.cand_idx[cand_at[q] + j] = o->cand_idx[j];
            }
        }
        __syncthreads();
        if (tid == 0) {
            s.n_sel  = sel_at[S];
            s.n_cand = cand_at[S];
        }
    }
    cluster.sync();  // the others' shared memory read: they may leave
    if (r == 0) finish(s, bin1, n_c, k, dst + (size_t) row * k);
}

// a launch of topk_cluster over `rows` rows in clusters of `size` CTAs (the attribute kept beside
// the config that points at it)
struct cluster_launch {
    cudaLaunchAttribute attr = {};
    cudaLaunchConfig_t  cfg  = {};

    cluster_launch(int size, int rows, cudaStream_t st) {
        attr.id               = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = size;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.gridDim           = dim3(rows * size);
        cfg.blockDim          = dim3(THREADS);
        cfg.dynamicSmemBytes  = sizeof(smem_t);
        cfg.stream            = st;
        cfg.attrs             = &attr;
        cfg.numAttrs          = 1;
    }

    cluster_launch(const cluster_launch &)             = delete;
    cluster_launch & operator=(const cluster_launch &) = delete;
};

// variant 0: A; else clusters of that many CTAs a row
void launch(int cluster, const float * x, int32_t * out, int * over, int rows, int n, int k, cudaStream_t st) {
    if (cluster == 0) {
        topk_one<<<rows, THREADS, sizeof(smem_t), st>>>(x, out, over, n, k);
        CHECK_CUDA(cudaGetLastError());
        return;
    }
    const cluster_launch l(cluster, rows, st);
    CHECK_CUDA(cudaLaunchKernelEx(&l.cfg, topk_cluster, x, out, over, n, k));
}

// how many clusters of `size` CTAs of topk_cluster the device can hold at once (0: none)
int max_clusters(int size) {
    const cluster_launch l(size, 1, nullptr);
    int                  n = 0;
    return cudaOccupancyMaxActiveClusters(&n, topk_cluster, &l.cfg) == cudaSuccess ? n : 0;
}

// the k largest of a row, exact ties to the lower index, in increasing index order
std::vector<int32_t> reference(const float * x, int n, int k) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    std::vector<int32_t> top(idx.begin(), idx.begin() + k);
    std::sort(top.begin(), top.end());
    return top;
}

}  // namespace

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs; qsa_topk's compact kernel at decode, k = 512; us a call (median of 20 graphs of 20)\n",
                prop.name, prop.multiProcessorCount);
    CHECK_CUDA(cudaFuncSetAttribute(topk_one, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) sizeof(smem_t)));
    CHECK_CUDA(cudaFuncSetAttribute(topk_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) sizeof(smem_t)));
    CHECK_CUDA(cudaFuncSetAttribute(topk_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    std::mt19937 rng(3);
    const int    k  = 512;
    for (int n : { 65536, 8192 }) {
        for (int rows : { 1, 8 }) {
            // scores as ReLU sums give them: non-negative, bunched, with exact ties (every 16th
            // key repeats an earlier one) and a stretch of zeros (blocks no head liked)
            std::vector<float> x((size_t) rows * n);
            std::gamma_distribution<float> g(4.0f, 0.25f);
            for (size_t i = 0; i < x.size(); ++i) {
                x[i] = i % 16 == 15 ? x[i - 7] : (i % 1000 < 30 ? 0.0f : g(rng));
            }
            float *   dx;
            int32_t * dout;
            int *     dover;
            CHECK_CUDA(cudaMalloc(&dx, x.size() * 4));
            CHECK_CUDA(cudaMalloc(&dout, (size_t) rows * k * 4));
            CHECK_CUDA(cudaMalloc(&dover, rows * 4));
            CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
            std::printf("\n%d row(s) of %d:\n", rows, n);
            for (int cluster : { 0, 8, 16 }) {
                const char * name = cluster == 0 ? "A  " : cluster == 8 ? "C8 " : "C16";
                if (cluster > 0 && max_clusters(cluster) == 0) {
                    std::printf("  %s  not schedulable here (no cluster of %d such CTAs fits)\n", name, cluster);
                    continue;
                }
                CHECK_CUDA(cudaMemset(dout, 0xff, (size_t) rows * k * 4));
                launch(cluster, dx, dout, dover, rows, n, k, st);
                CHECK_CUDA(cudaStreamSynchronize(st));
                std::vector<int32_t> out((size_t) rows * k);
                std::vector<int>     over(rows);
                CHECK_CUDA(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
                CHECK_CUDA(cudaMemcpy(over.data(), dover, rows * 4, cudaMemcpyDeviceToHost));
                bool same = true;
                for (int r = 0; r < rows; ++r) {
                    same = same && !over[r] &&
                           reference(x.data() + (size_t) r * n, n, k) ==
                               std::vector<int32_t>(out.begin() + (size_t) r * k, out.begin() + (size_t) (r + 1) * k);
                }
                if (!same) {
                    std::printf("  %s  check FAILED\nCHECKS FAILED\n", name);
                    return 1;
                }
                cudaGraph_t     graph;
                cudaGraphExec_t exec;
                CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int c = 0; c < 20; ++c) {
                    launch(cluster, dx, dout, dover, rows, n, k, st);
                }
                CHECK_CUDA(cudaStreamEndCapture(st, &graph));
                CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
                CHECK_CUDA(cudaGraphLaunch(exec, st));
                CHECK_CUDA(cudaStreamSynchronize(st));
                cudaEvent_t e0, e1;
                CHECK_CUDA(cudaEventCreate(&e0));
                CHECK_CUDA(cudaEventCreate(&e1));
                std::vector<float> us;
                for (int rep = 0; rep < 20; ++rep) {
                    CHECK_CUDA(cudaEventRecord(e0, st));
                    CHECK_CUDA(cudaGraphLaunch(exec, st));
                    CHECK_CUDA(cudaEventRecord(e1, st));
                    CHECK_CUDA(cudaEventSynchronize(e1));
                    float ms;
                    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                    us.push_back(1e3f * ms / 20);
                }
                std::sort(us.begin(), us.end());
                std::printf("  %s  check ok  %8.2f us (%.2f-%.2f)\n", name, us[10], us.front(), us.back());
                CHECK_CUDA(cudaEventDestroy(e0));
                CHECK_CUDA(cudaEventDestroy(e1));
                CHECK_CUDA(cudaGraphExecDestroy(exec));
                CHECK_CUDA(cudaGraphDestroy(graph));
            }
            CHECK_CUDA(cudaFree(dx));
            CHECK_CUDA(cudaFree(dout));
            CHECK_CUDA(cudaFree(dover));
        }
    }
    std::printf("\nall checks passed\n");
    return 0;
}
