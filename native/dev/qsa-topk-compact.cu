// Dev corner (see README.md here): QSA_TOPK over a prefill chunk's block scores reading each row
// twice instead of five times, before anything moves into native/ggml.
//
// The op (native/include/pyqsa-ggml.h): per row the k largest scores, exact ties to the lower
// index, entries at or past n_vis counting as -inf, the winners written in increasing index
// order. The library's kernel (native/ggml/cuda/qsa-topk.cu) runs four 8-bit radix passes and an
// ordered output pass over the row in global memory; its first pass barely splits (nearly all
// scores share sign and exponent), and the output pass takes three barriers per 1024 entries.
// At 2048 rows x 65536 blocks (a 2048-token chunk at 256K) it takes 2210 us a layer on the H200
// (test-qsa-ops perf at 18a4c7c: QSA_SCORE + QSA_TOPK 5008.8 us less QSA_SCORE 2798.9).
//
// This variant, one CTA of 1024 threads a row:
//   1. one pass: a histogram of the keys' top 11 bits (2048 bins) gives the bin B holding the
//      k-th largest key and the count above it;
//   2. a second pass copies the indices of the keys above B (fewer than k) and the keys and
//      indices of B's keys (the candidates, counted in pass 1: they must fit in shared memory,
//      else the row is left to the library's kernel, reported here as an overflow);
//   3. three 7-bit radix passes over the candidates in shared memory give the k-th key T; the
//      candidates above T join the winners, and of those equal to T the lowest indices (a radix
//      select over their indices) up to k;
//   4. a bitonic sort of the k winners' indices gives the increasing order.
// Checked against the op's rule on the CPU (a full sort by (score desc, index asc)) bit for bit.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda native/dev/qsa-topk-compact.cu \
//        -o /tmp/qsa-topk-compact && /tmp/qsa-topk-compact
#include "ordered-key.cuh"

#include "cuda-check.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;
constexpr int BINS1   = 2048;   // pass 1: the top 11 bits of a key
constexpr int CAP     = 12288;  // candidates held in shared memory (key + index)
constexpr int KMAX    = 1024;   // winners sorted in shared memory

struct smem_t {
    int      hist[BINS1];
    uint32_t cand_key[CAP];
    int      cand_idx[CAP];
    int      eq_idx[CAP];  // the candidates equal to T, by index
    int      sel[KMAX];
    int      warp_sum[WARPS];
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

// grid (rows), THREADS threads; overflow[row] = 1 when the row's candidates do not fit (the row is
// then left unwritten, for the library's kernel)
__global__ void __launch_bounds__(THREADS) topk_compact(const float * score, const int * n_vis, int * dst,
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
    if (n_c > CAP || k > KMAX || n > (1 << 22)) {
        if (tid == 0) overflow[blockIdx.x] = 1;
        return;
    }

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
    int * out = dst + (size_t) blockIdx.x * k;
    for (int j = tid; j < k; j += THREADS) out[j] = s.sel[j];
}

}  // namespace

namespace {

constexpr size_t SMEM = sizeof(smem_t);

// the op's rule on the CPU: sort by (score desc, index asc), keep k, increasing index order
std::vector<int> reference(const std::vector<float> & x, int vis, int k) {
    std::vector<float> v(x);
    for (size_t i = vis; i < v.size(); ++i) v[i] = -INFINITY;
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
}

struct tcase {
    const char * name;
    int          rows, n, k;
    int          kind;  // 0: ReLU-sum-like scores; 1: few distinct values (many ties); 2: all equal; 3: short n_vis
};

std::vector<float> make_row(const tcase & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(c.n);
    for (auto & v : x) {
        switch (c.kind) {
            case 1: v = (float) (int) (4.0f * std::fabs(nd(rng))); break;
            case 2: v = 0.5f; break;
            default: {  // four heads' ReLUs summed and scaled, as QSA_SCORE's scores
                float s = 0.0f;
                for (int h = 0; h < 4; ++h) s += std::max(nd(rng), 0.0f);
                v = s * 0.0884f;
            }
        }
    }
    return x;
}

struct run_result {
    std::vector<int> out, overflow;
};

run_result run(const std::vector<float> & x, const std::vector<int> & vis, int rows, int n, int k, float * us) {
    float *score;
    int *  nv, *dst, *ovf;
    CHECK_CUDA(cudaMalloc(&score, x.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&nv, rows * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&dst, (size_t) rows * k * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&ovf, rows * sizeof(int)));
    CHECK_CUDA(cudaMemcpy(score, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(nv, vis.data(), rows * sizeof(int), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(dst, 0xff, (size_t) rows * k * sizeof(int)));
    CHECK_CUDA(cudaMemset(ovf, 0, rows * sizeof(int)));
    const auto launch = [&] { topk_compact<<<rows, THREADS, SMEM>>>(score, nv, dst, ovf, n, k); };
    launch();
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    run_result r;
    r.out.resize((size_t) rows * k);
    r.overflow.resize(rows);
    CHECK_CUDA(cudaMemcpy(r.out.data(), dst, r.out.size() * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(r.overflow.data(), ovf, rows * sizeof(int), cudaMemcpyDeviceToHost));
    if (us) {  // median of 5 runs of 10 calls
        cudaEvent_t a, b;
        CHECK_CUDA(cudaEventCreate(&a));
        CHECK_CUDA(cudaEventCreate(&b));
        std::vector<float> t;
        for (int rep = 0; rep < 5; ++rep) {
            CHECK_CUDA(cudaEventRecord(a));
            for (int i = 0; i < 10; ++i) launch();
            CHECK_CUDA(cudaEventRecord(b));
            CHECK_CUDA(cudaEventSynchronize(b));
            float ms = 0.0f;
            CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
            t.push_back(ms * 100.0f);
        }
        std::sort(t.begin(), t.end());
        us[0] = t[2];
        us[1] = t[0];
        us[2] = t[4];
    }
    cudaFree(score);
    cudaFree(nv);
    cudaFree(dst);
    cudaFree(ovf);
    return r;
}

}  // namespace

int main() {
    CHECK_CUDA(cudaFuncSetAttribute(topk_compact, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) SMEM));
    std::mt19937 rng(3);
    const tcase checks[] = {
        { "scores", 37, 65536, 512, 0 },
        { "scores", 64, 8192, 512, 0 },
        { "scores, k = n", 8, 700, 700, 0 },
        { "scores, short n_vis", 40, 4096, 512, 3 },
        { "many ties", 32, 20000, 512, 1 },
        { "all equal (overflows)", 4, 65536, 512, 2 },
        { "all equal, fits", 4, 9000, 512, 2 },
    };
    bool ok = true;
    std::printf("checks against the op's rule (sort by score desc, index asc), bit for bit:\n");
    for (const tcase & c : checks) {
        std::vector<float> x;
        std::vector<int>   vis(c.rows);
        for (int r = 0; r < c.rows; ++r) {
            const std::vector<float> row = make_row(c, rng);
            x.insert(x.end(), row.begin(), row.end());
            vis[r] = c.kind == 3 ? (int) (rng() % (2 * c.k)) : c.n;  // some rows with fewer visible than k
        }
        const run_result g = run(x, vis, c.rows, c.n, c.k, nullptr);
        int n_match = 0, n_over = 0;
        for (int r = 0; r < c.rows; ++r) {
            if (g.overflow[r]) {
                ++n_over;
                continue;
            }
            const std::vector<float> row(x.begin() + (size_t) r * c.n, x.begin() + (size_t) (r + 1) * c.n);
            const std::vector<int>   ref = reference(row, vis[r], c.k);
            n_match += std::equal(ref.begin(), ref.end(), g.out.begin() + (size_t) r * c.k);
        }
        // all-equal rows of 65536 must overflow (65536 candidates), every other row must not
        const bool want_over = c.kind == 2 && c.n > CAP;
        const bool pass = n_match == c.rows - n_over && (want_over ? n_over == c.rows : n_over == 0);
        std::printf("  %-24s rows=%d n=%d k=%d: %d of %d rows equal, %d overflowed: %s\n", c.name, c.rows, c.n, c.k,
                    n_match, c.rows, n_over, pass ? "OK" : "FAIL");
        ok &= pass;
    }
    if (!ok) {
        std::printf("a check failed: no timings\n");
        return 1;
    }
    std::printf("timings (us a call, median of 5 runs of 10, range); the library's qsa_topk at 2048 x 65536: 2210 us"
                " (test-qsa-ops perf, 18a4c7c)\n");
    const tcase shapes[] = { { "2048 x 65536", 2048, 65536, 512, 0 }, { "512 x 65536", 512, 65536, 512, 0 },
                             { "2048 x 8192", 2048, 8192, 512, 0 } };
    for (const tcase & c : shapes) {
        std::vector<float> x;
        for (int r = 0; r < c.rows; ++r) {
            const std::vector<float> row = make_row(c, rng);
            x.insert(x.end(), row.begin(), row.end());
        }
        float us[3];
        const run_result g = run(x, std::vector<int>(c.rows, c.n), c.rows, c.n, c.k, us);
        const int n_over = (int) std::count(g.overflow.begin(), g.overflow.end(), 1);
        std::printf("  %-14s %.1f us (%.1f-%.1f), %d rows overflowed\n", c.name, us[0], us[1], us[2], n_over);
    }
    std::printf("all checks passed\n");
    return 0;
}
