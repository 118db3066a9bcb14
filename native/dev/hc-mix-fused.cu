// Study: the hyper-connection mix of one token as one persistent kernel. The library's mix is two
// launches (hc_down, then hc_pre, which needs all of hc_down's low-rank output): 16.5 us a mix on one
// H100 (test-fused perf at bccec31) for 13.1 MB of f16 weights, 3.9 us of bytes at 3.35 TB/s, and 96
// mixes a step. hc_down holds ~58K registers of most SMs, so hc_pre's CTAs, whose weight loads come
// before their wait (PDL), mostly start only once hc_down's have left. Here both products' weights
// are loaded into registers at the kernel's start, by one CTA a SM, then the down product, one grid
// barrier, the up product: one launch and one round of weight loads. Forms (Flash-Next's shape:
// n_embd 2560, 4 streams, rank 320, f16 weights, f32 activations; the same warp tasks in both):
//   T2  two launches (down tasks, then up tasks), each loading its weights first
//   F   one launch of both, a grid barrier between (a CTA a SM, all resident)
// Checked against a double reference first, then timed as the median of 20 CUDA graphs of 16 mixes,
// each on another copy of the weights (copies past 4x the L2). Compare F with the library's
// HC_DOWN+HC_PRE time from test-fused perf in the same call.
#include "cuda-check.cuh"
#include "graph-timing.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int E       = 2560;      // n_embd
constexpr int HC      = 4;         // streams
constexpr int LR      = 320;       // low rank
constexpr int K       = HC * E;    // a down row's length
constexpr int ROWS    = LR + HC;   // down rows: w_down's, then w_inject's
constexpr int SLICE   = E / 2;     // a down task's columns: half a stream
constexpr int SLICES  = K / SLICE;  // 8 a row
constexpr int N_DOWN  = ROWS * SLICES;
constexpr int N_UP    = E;         // an up task: one position's HC rows of w_up
constexpr int WARP    = 32;
constexpr int THREADS = 512;
constexpr int WARPS   = THREADS / WARP;
constexpr int TASKS   = 2;         // tasks of each kind a warp at most
constexpr int LOADS   = 5;         // 8-weight chunks a lane, a task (both kinds: 1280 weights a task)
static_assert(SLICE == WARP * LOADS * 8 && HC * LR == WARP * LOADS * 8, "a task is 5 chunks a lane");

struct args {
    const half *  w_down;    // [LR][K]
    const half *  w_inject;  // [HC][K]
    const half *  w_up;      // [K][LR]: row c E + e
    const float * x;         // [HC][E]
    const float * w_norm;    // [HC][E]
    float *       partial;   // [ROWS][SLICES]
    float *       inject;    // [HC]
    float *       dst;       // [E]
    unsigned *    barrier;   // {count, generation, timed out}
    float         eps, scale_down, scale_up;
};

struct task_weights {
    uint4 v[TASKS][LOADS];
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// 8 f16 weights times 8 floats at s
__device__ __forceinline__ float dot8(uint4 w, const float * s, float acc) {
    const half2 * h = (const half2 *) &w;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        acc            = fmaf(f.x, s[2 * i], acc);
        acc            = fmaf(f.y, s[2 * i + 1], acc);
    }
    return acc;
}

__device__ __forceinline__ const half * down_row(const args & a, int r) {
    return r < LR ? a.w_down + (size_t) r * K : a.w_inject + (size_t) (r - LR) * K;
}

// down task d: row d / SLICES, columns (d % SLICES) SLICE ..; lane chunk j = lane + 32 i
__device__ __forceinline__ void load_down(const args & a, int d, uint4 (&w)[LOADS], int lane) {
    const half * row = down_row(a, d / SLICES) + (d % SLICES) * SLICE;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        w[i] = __ldcs((const uint4 *) row + lane + WARP * i);
    }
}

// up task e: chunk p = lane + 32 i of the HC rows c E + e (40 chunks a row) is row p / 40's chunk p % 40
__device__ __forceinline__ void load_up(const args & a, int e, uint4 (&w)[LOADS], int lane) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int p = lane + WARP * i;
        w[i]        = __ldcs((const uint4 *) (a.w_up + (size_t) ((p / (LR / 8)) * E + e) * LR) + p % (LR / 8));
    }
}

// the down task's sum of w . (x w_norm) over its columns (the streams' RMS factors come after)
__device__ __forceinline__ void run_down(const args & a, int d, const uint4 (&w)[LOADS], int lane) {
    const int col0 = (d % SLICES) * SLICE;  // x and w_norm are [HC][E]: a column's index is theirs
    float     acc  = 0.0f;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int k = col0 + (lane + WARP * i) * 8;
        float     xg[8];
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            xg[v] = a.x[k + v] * a.w_norm[k + v];
        }
        acc = dot8(w[i], xg, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        a.partial[d] = acc;
    }
}

// the up task e: gates from lo (shared memory), the gated mean of the streams into dst[e]
__device__ __forceinline__ void run_up(const args & a, int e, const uint4 (&w)[LOADS], const float * lo,
                                       const float * factor, int lane) {
    float g[HC] = {};
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int p = lane + WARP * i, c = p / (LR / 8);
        const float d = dot8(w[i], lo + (p % (LR / 8)) * 8, 0.0f);
#pragma unroll
        for (int cc = 0; cc < HC; ++cc) {
            g[cc] += cc == c ? d : 0.0f;  // registers, no local memory
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < HC; ++c) {
        const float gate = warp_sum(g[c]);
        const float xn   = a.x[c * E + e] * factor[c] * a.w_norm[c * E + e];
        sum += xn / (1.0f + expf(-gate));
    }
    if (lane == 0) {
        a.dst[e] = a.scale_up * sum;
    }
}

// every CTA: the streams' RMS factors into shared memory
__device__ void stream_factors(const args & a, float * factor) {
    __shared__ float part[WARPS][HC];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    float     ss[HC] = {};
#pragma unroll
    for (int c = 0; c < HC; ++c) {
        for (int e = threadIdx.x; e < E; e += THREADS) {
            ss[c] += a.x[c * E + e] * a.x[c * E + e];
        }
        ss[c] = warp_sum(ss[c]);
        if (lane == 0) {
            part[warp][c] = ss[c];
        }
    }
    __syncthreads();
    if (threadIdx.x < HC) {
        float s = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
            s += part[w][threadIdx.x];
        }
        factor[threadIdx.x] = 1.0f / sqrtf(s / (float) E + a.eps);
    }
    __syncthreads();
}

// every CTA: lo (silu of the scaled low-rank sums) into shared memory; the first also stores inject
__device__ void low_rank(const args & a, const float * factor, float * lo) {
    for (int r = threadIdx.x; r < ROWS; r += THREADS) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < HC; ++c) {
            s += factor[c] * (a.partial[r * SLICES + 2 * c] + a.partial[r * SLICES + 2 * c + 1]);
        }
        if (r < LR) {
            const float v = a.scale_down * s;
            lo[r]         = v / (1.0f + expf(-v));
        } else if (blockIdx.x == 0) {
            a.inject[r - LR] = s;
        }
    }
    __syncthreads();
}

// all CTAs of the grid (each resident: a CTA a SM) meet here; reusable launch after launch
__device__ void grid_barrier(unsigned * bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned * gen = bar + 1;
        const unsigned      g   = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            bar[0] = 0;
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            // a CTA that never comes (not resident) would hang the study: give up after ~1 s, flagged
            for (long long spins = 0; *gen == g; ++spins) {
                if (spins > (1ll << 26)) {
                    bar[2] = 1;
                    break;
                }
            }
        }
        __threadfence();
    }
    __syncthreads();
}

enum part { DOWN = 1, UP = 2, BOTH = 3 };

// warp w takes down tasks w, w + W (below N_DOWN) and up tasks w, w + W (below N_UP), W the grid's warps
template <int PARTS> __global__ void __launch_bounds__(THREADS, 1) mix(const args a) {
    __shared__ float factor[HC];
    __shared__ float lo[LR];
    const int lane = threadIdx.x % WARP;
    const int w0   = blockIdx.x * WARPS + threadIdx.x / WARP, W = gridDim.x * WARPS;
    task_weights down, up;
    if constexpr (PARTS & DOWN) {
#pragma unroll
        for (int t = 0; t < TASKS; ++t) {
            if (w0 + t * W < N_DOWN) {
                load_down(a, w0 + t * W, down.v[t], lane);
            }
        }
    }
    if constexpr (PARTS & UP) {
#pragma unroll
        for (int t = 0; t < TASKS; ++t) {
            if (w0 + t * W < N_UP) {
                load_up(a, w0 + t * W, up.v[t], lane);
            }
        }
    }
    if constexpr (PARTS & DOWN) {
#pragma unroll
        for (int t = 0; t < TASKS; ++t) {
            if (w0 + t * W < N_DOWN) {
                run_down(a, w0 + t * W, down.v[t], lane);
            }
        }
    }
    if constexpr (PARTS & UP) {
        stream_factors(a, factor);  // x alone: before the barrier, while the last down tasks finish
    }
    if constexpr (PARTS == BOTH) {
        __threadfence();
        grid_barrier(a.barrier);
    }
    if constexpr (PARTS & UP) {
        low_rank(a, factor, lo);
#pragma unroll
        for (int t = 0; t < TASKS; ++t) {
            if (w0 + t * W < N_UP) {
                run_up(a, w0 + t * W, up.v[t], lo, factor, lane);
            }
        }
    }
}

enum form { FORM_T2, FORM_F, N_FORMS };
const char * form_name[N_FORMS] = { "T2", "F" };

void launch(form f, const args & a, int ctas, cudaStream_t st) {
    if (f == FORM_F) {
        mix<BOTH><<<ctas, THREADS, 0, st>>>(a);
    } else {
        mix<DOWN><<<ctas, THREADS, 0, st>>>(a);
        mix<UP><<<ctas, THREADS, 0, st>>>(a);
    }
}

}  // namespace

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mix<BOTH>, THREADS, 0));
    const int ctas = prop.multiProcessorCount;  // one a SM: all resident for the barrier
    std::printf("hc-mix-fused: %s, %d SMs (%d CTAs of the fused kernel fit a SM), L2 %d MB; n_embd %d, %d streams, "
                "rank %d, one token\n",
                prop.name, prop.multiProcessorCount, per_sm, prop.l2CacheSize >> 20, E, HC, LR);
    if (per_sm < 1 || ctas * WARPS * TASKS < std::max(N_DOWN, N_UP)) {
        std::printf("the grid cannot hold every task: FAILED\n");
        return 1;
    }
    const size_t n_w   = (size_t) (LR + HC) * K + (size_t) K * LR;  // weights a mix
    const size_t bytes = n_w * sizeof(half);
    const int    copies = (int) std::max<size_t>(2, 4 * (size_t) prop.l2CacheSize / bytes + 1);
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<half>  w(n_w);
    std::vector<float> wf(n_w);  // the f16 weights as floats, for the reference
    const float        wscale = 0.02f;
    for (size_t i = 0; i < n_w; ++i) {
        w[i]  = __float2half(wscale * nd(rng));
        wf[i] = __half2float(w[i]);
    }
    std::vector<float> x(HC * E), w_norm(HC * E);
    for (float & v : x) v = nd(rng);
    for (float & v : w_norm) v = 1.0f + 0.1f * nd(rng);
    const float eps = 1e-6f, scale_down = 0.5f, scale_up = 1.0f;
    // the reference in double
    const float * wd = wf.data();
    const float * wu = wf.data() + (size_t) (LR + HC) * K;
    double factor[HC];
    for (int c = 0; c < HC; ++c) {
        double s = 0.0;
        for (int e = 0; e < E; ++e) s += (double) x[c * E + e] * x[c * E + e];
        factor[c] = 1.0 / std::sqrt(s / E + eps);
    }
    std::vector<double> lo(LR), inject(HC), ref(E);
    for (int r = 0; r < ROWS; ++r) {
        double s = 0.0;
        for (int c = 0; c < HC; ++c) {
            double d = 0.0;
            for (int e = 0; e < E; ++e) d += (double) wd[(size_t) r * K + c * E + e] * x[c * E + e] * w_norm[c * E + e];
            s += factor[c] * d;
        }
        if (r < LR) {
            const double v = scale_down * s;
            lo[r]          = v / (1.0 + std::exp(-v));
        } else {
            inject[r - LR] = s;
        }
    }
    double mag = 0.0;
    for (int e = 0; e < E; ++e) {
        double sum = 0.0;
        for (int c = 0; c < HC; ++c) {
            double g = 0.0;
            for (int k = 0; k < LR; ++k) g += (double) wu[(size_t) (c * E + e) * LR + k] * lo[k];
            sum += (double) x[c * E + e] * factor[c] * w_norm[c * E + e] / (1.0 + std::exp(-g));
        }
        ref[e] = scale_up * sum;
        mag    = std::max(mag, std::fabs(ref[e]));
    }
    half *     w_d;
    float *    x_d, *norm_d, *partial_d, *inject_d, *dst_d;
    unsigned * bar_d;
    CHECK_CUDA(cudaMalloc(&w_d, bytes * copies));
    for (int c = 0; c < copies; ++c) {
        CHECK_CUDA(cudaMemcpy(w_d + c * n_w, w.data(), bytes, cudaMemcpyHostToDevice));
    }
    CHECK_CUDA(cudaMalloc(&x_d, x.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&norm_d, w_norm.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&partial_d, N_DOWN * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&inject_d, HC * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dst_d, E * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&bar_d, 3 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(bar_d, 0, 3 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemcpy(x_d, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(norm_d, w_norm.data(), w_norm.size() * sizeof(float), cudaMemcpyHostToDevice));
    const auto args_of = [&](int copy) {
        const half * base = w_d + (size_t) copy * n_w;
        return args{ base, base + (size_t) LR * K, base + (size_t) (LR + HC) * K, x_d, norm_d, partial_d,
                     inject_d, dst_d, bar_d, eps, scale_down, scale_up };
    };
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    std::printf("%.1f MB of weights a mix, %d copies, %d CTAs of %d threads\n", bytes / 1e6, copies, ctas, THREADS);
    bool all_ok = true;
    for (int f = 0; f < N_FORMS; ++f) {
        CHECK_CUDA(cudaMemset(dst_d, 0xff, E * sizeof(float)));
        CHECK_CUDA(cudaMemset(inject_d, 0xff, HC * sizeof(float)));
        launch((form) f, args_of(0), ctas, st);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaStreamSynchronize(st));
        std::vector<float> y(E), inj(HC);
        CHECK_CUDA(cudaMemcpy(y.data(), dst_d, E * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(inj.data(), inject_d, HC * sizeof(float), cudaMemcpyDeviceToHost));
        double err = 0.0, err_inj = 0.0, mag_inj = 0.0;
        for (int e = 0; e < E; ++e) err = std::max(err, std::fabs(y[e] - ref[e]) / mag);
        for (int i = 0; i < HC; ++i) mag_inj = std::max(mag_inj, std::fabs(inject[i]));
        for (int i = 0; i < HC; ++i) err_inj = std::max(err_inj, std::fabs(inj[i] - inject[i]) / mag_inj);
        unsigned timed_out = 0;
        CHECK_CUDA(cudaMemcpy(&timed_out, bar_d + 2, sizeof(unsigned), cudaMemcpyDeviceToHost));
        if (timed_out) {
            std::printf("  %-2s the grid barrier timed out (the CTAs were not all resident): FAIL\n", form_name[f]);
            all_ok = false;
            continue;
        }
        const bool ok = err < 1e-4 && err_inj < 1e-4;
        all_ok        = all_ok && ok;
        std::printf("  %-2s max |err| / max |out| %.2e, inject %.2e: %s", form_name[f], err, err_inj,
                    ok ? "OK" : "FAIL\n");
        if (!ok) {
            continue;  // a failed form is not timed
        }
        // 16 mixes a graph, each on the next copy
        const launch_times t = time_launches(st, 16, [&](int i) { launch((form) f, args_of(i % copies), ctas, st); });
        std::printf("; %8.2f us a mix (%.2f-%.2f), %.0f GB/s of weights\n", t.median, t.min, t.max,
                    bytes / (t.median * 1e3));
    }
    CHECK_CUDA(cudaFree(w_d));
    CHECK_CUDA(cudaFree(x_d));
    CHECK_CUDA(cudaFree(norm_d));
    CHECK_CUDA(cudaFree(partial_d));
    CHECK_CUDA(cudaFree(inject_d));
    CHECK_CUDA(cudaFree(dst_d));
    CHECK_CUDA(cudaFree(bar_d));
    std::printf("\n%s\n", all_ok ? "all forms passed" : "a form FAILED");
    return all_ok ? 0 : 1;
}
