// Dev corner (see README.md here): one-column f16 products of the narrow matrices of a
// one-sequence decode step, the ones the library leaves to upstream's MMVF. NOT yet run on a GPU.
//
// At one sequence the step's products with fewer rows than two a warp for two CTAs a SM (fewer
// than 4224 on an H100) stay on MMVF (pyqsa_cuda_gemv: a warp a row was slower there), 289
// launches and 2.13 ms of a 1 x 32K step's 8.35 ms of kernels under the profiler
// (bench/results/2026-12-06-abe7fc1-kernels.txt), ~7.4 us a launch. The shapes here, N rows of
// K (f16 weights, one f32 column): the hyper-connection norm's down and inject (20 x 10240), the
// attention's K and V (512 x 2560), the shared expert's gate and up (1024 x 2560) and down
// (2560 x 512), the linear attention's output (2560 x 4096), the QSA layers' output
// (2560 x 6144), a 4096 x 2560.
//   A      the library's one-column gemv (a warp a row, 8 warps a CTA: gemv_f16<1>, copied: the
//          dev corner is standalone).
//   C      a CTA of 256 threads a row, every thread a strided share of the row's 16-byte chunks,
//          the sums added through shared memory (the way MMVF reads a row).
//   S4, S8 a CTA of 8 warps takes 4 or 8 rows, each warp an eighth of K for all of them (its
//          lanes' chunks strided within it), the warps' sums added through shared memory in warp
//          order: a CTA reads several rows at once with every warp in flight.
//   K4, K8 S4 with K split further over a thread-block cluster of 4 or 8 CTAs (sm_90), the first
//          CTA adding the others' sums in rank order through distributed shared memory: the
//          narrowest matrices (20 rows) get CTAs enough to fill the GPU.
// Each variant is checked at every shape against a double-precision reference (each row's error within 1e-4 of
// its sum of |w x|) before any is timed: CUDA graphs of 20 launches, each on weights of their own, the
// graphs taking turns over at least 256 MB of weights, so the reads come from HBM as a step's do
// (its matrices are read once a step), not from the 50 MB L2; us a launch and GB/s of weights,
// the median of 20 rounds.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a native/dev/gemv1-narrow.cu -o /tmp/gemv1-narrow && /tmp/gemv1-narrow
#include "cuda-check.cuh"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int WARPS = 8;
constexpr int CHUNK = 8;  // halves a lane loads at once: 16 bytes

// y += the 8 products of chunk v of w with x[0..7], in order
__device__ __forceinline__ float chunk_dot(const uint4 & v, const float * x, float y) {
    const half2 * h = (const half2 *) &v;
#pragma unroll
    for (int i = 0; i < CHUNK / 2; ++i) {
        const float2 f = __half22float2(h[i]);
        y              = fmaf(f.x, x[2 * i], y);
        y              = fmaf(f.y, x[2 * i + 1], y);
    }
    return y;
}

__device__ __forceinline__ void load_x(const float * x, int c, float (&xf)[CHUNK]) {
    const float4 a = __ldg((const float4 *) (x + c * CHUNK));
    const float4 b = __ldg((const float4 *) (x + c * CHUNK) + 1);
    xf[0] = a.x, xf[1] = a.y, xf[2] = a.z, xf[3] = a.w, xf[4] = b.x, xf[5] = b.y, xf[6] = b.z, xf[7] = b.w;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A: grid (ceil(N / WARPS)), WARPS warps; w F16 [K, N] (rows of K), x F32 [K], y F32 [N]
__global__ void __launch_bounds__(WARPS * 32) gemv_warp_row(const half * w, const float * x, float * y, int N, int K) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const uint4 * wr  = (const uint4 *) (w + (size_t) row * K);
    float         acc = 0.0f;
#pragma unroll 4
    for (int c = lane; c < K / CHUNK; c += 32) {
        const uint4 v = __ldcs(wr + c);
        float       xf[CHUNK];
        load_x(x, c, xf);
        acc = chunk_dot(v, xf, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

// C: grid (N), 256 threads
__global__ void __launch_bounds__(256) gemv_cta_row(const half * w, const float * x, float * y, int N, int K) {
    __shared__ float part[8];
    const uint4 *    wr  = (const uint4 *) (w + (size_t) blockIdx.x * K);
    float            acc = 0.0f;
    for (int c = threadIdx.x; c < K / CHUNK; c += 256) {
        const uint4 v = __ldcs(wr + c);
        float       xf[CHUNK];
        load_x(x, c, xf);
        acc = chunk_dot(v, xf, acc);
    }
    acc = warp_sum(acc);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < 8; ++i) s += part[i];
        y[blockIdx.x] = s;
    }
}

// S<R> (and K<R> with SPLIT): grid (ceil(N / R) * S) in clusters of S CTAs along x, WARPS warps.
// Cluster CTA `rank` takes the chunks [rank C / S, (rank + 1) C / S) of its R rows (C = K / 8),
// warp w an eighth of those; each row's sum: lanes' chunks in order, the warp's butterfly, the
// warps in order, then (SPLIT) the cluster's CTAs in rank order.
template <int R, bool SPLIT>
__global__ void __launch_bounds__(WARPS * 32) gemv_rows_split(const half * w, const float * x, float * y, int N, int K) {
    __shared__ float part[WARPS][R];
    __shared__ float cta_sum[R];
    namespace cg = cooperative_groups;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int S = SPLIT ? (int) cg::this_cluster().num_blocks() : 1;
    const int rank = SPLIT ? (int) cg::this_cluster().block_rank() : 0;
#else
    const int S = 1, rank = 0;
#endif
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x / S * R;
    const int C = K / CHUNK, c_beg = C * rank / S, c_end = C * (rank + 1) / S;
    const int w_beg = c_beg + (c_end - c_beg) * warp / WARPS, w_end = c_beg + (c_end - c_beg) * (warp + 1) / WARPS;
    float     acc[R];
    const uint4 * wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = 0.0f;
        wr[r]  = (const uint4 *) (w + (size_t) min(row0 + r, N - 1) * K);  // rows past N: row N - 1 again, not written
    }
    for (int c = w_beg + lane; c < w_end; c += 32) {
        float xf[CHUNK];
        load_x(x, c, xf);
        uint4 v[R];
#pragma unroll
        for (int r = 0; r < R; ++r) v[r] = __ldcs(wr[r] + c);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = chunk_dot(v[r], xf, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = acc[r];
    }
    __syncthreads();
    if (threadIdx.x < R) {
        float s = 0.0f;
        for (int i = 0; i < WARPS; ++i) s += part[i][threadIdx.x];
        cta_sum[threadIdx.x] = s;
        if (!SPLIT && row0 + threadIdx.x < N) y[row0 + threadIdx.x] = s;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (SPLIT) {
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();
        if (rank == 0 && threadIdx.x < R && row0 + threadIdx.x < N) {
            float s = 0.0f;
            for (int q = 0; q < S; ++q) s += cluster.map_shared_rank(cta_sum, q)[threadIdx.x];
            y[row0 + threadIdx.x] = s;
        }
        cluster.sync();  // no CTA leaves before the first has read its sums
    }
#endif
}

struct variant {
    const char * name;
    int          rows;     // rows a CTA (a cluster)
    int          cluster;  // CTAs a row block (1: no cluster)
};

const variant VARIANTS[] = {
    { "A  ", 0, 1 }, { "C  ", 0, 1 }, { "S4 ", 4, 1 }, { "S8 ", 8, 1 }, { "K4 ", 4, 4 }, { "K8 ", 4, 8 },
};

// a launch of gemv_rows_split<4, true> over `blocks` row blocks in clusters of `size` CTAs (the
// attribute kept beside the config that points at it)
struct cluster_launch {
    cudaLaunchAttribute attr = {};
    cudaLaunchConfig_t  cfg  = {};

    cluster_launch(int size, int blocks, cudaStream_t st) {
        attr.id               = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = size;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.gridDim           = dim3(blocks * size);
        cfg.blockDim          = dim3(WARPS * 32);
        cfg.stream            = st;
        cfg.attrs             = &attr;
        cfg.numAttrs          = 1;
    }

    cluster_launch(const cluster_launch &)             = delete;
    cluster_launch & operator=(const cluster_launch &) = delete;
};

void launch(const variant & v, const half * w, const float * x, float * y, int N, int K, cudaStream_t st) {
    if (v.name[0] == 'A') {
        gemv_warp_row<<<(N + WARPS - 1) / WARPS, WARPS * 32, 0, st>>>(w, x, y, N, K);
    } else if (v.name[0] == 'C') {
        gemv_cta_row<<<N, 256, 0, st>>>(w, x, y, N, K);
    } else if (v.cluster == 1) {
        const int blocks = (N + v.rows - 1) / v.rows;
        if (v.rows == 4) {
            gemv_rows_split<4, false><<<blocks, WARPS * 32, 0, st>>>(w, x, y, N, K);
        } else {
            gemv_rows_split<8, false><<<blocks, WARPS * 32, 0, st>>>(w, x, y, N, K);
        }
    } else {
        const cluster_launch l(v.cluster, (N + v.rows - 1) / v.rows, st);
        CHECK_CUDA(cudaLaunchKernelEx(&l.cfg, gemv_rows_split<4, true>, w, x, y, N, K));
    }
    CHECK_CUDA(cudaGetLastError());
}

struct shape {
    int          N, K;
    const char * what;
};

const shape SHAPES[] = {
    { 20, 10240, "hyper-connection norm's down and inject" },
    { 512, 2560, "attention K or V" },
    { 1024, 2560, "shared expert gate and up" },
    { 2560, 512, "shared expert down" },
    { 2560, 4096, "linear attention output" },
    { 2560, 6144, "QSA output" },
    { 4096, 2560, "4096 x 2560" },
};

// whether the device can run v (a cluster size it cannot schedule: no)
bool runs_here(const variant & v) {
    if (v.cluster == 1) return true;
    const cluster_launch l(v.cluster, 1, nullptr);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, gemv_rows_split<4, true>, &l.cfg) != cudaSuccess) {
        (void) cudaGetLastError();
        return false;
    }
    return n > 0;
}

// a shape's weights on the device in copies enough for 256 MB (a multiple of a graph's 20
// launches), its x, its result, and its double reference
struct problem {
    const shape &       s;
    size_t              bytes;
    int                 copies;
    std::vector<half>   w;
    std::vector<double> ref, mag;  // per row: the sum and the sum of |w x|
    half *              dw = nullptr;
    float *             dx = nullptr;
    float *             dy = nullptr;

    explicit problem(const shape & s, std::mt19937 & rng) :
        s(s),
        bytes((size_t) s.N * s.K * sizeof(half)),
        copies(std::max(20, (int) (((256u << 20) + bytes - 1) / bytes + 19) / 20 * 20)),
        w((size_t) s.N * s.K),
        ref(s.N),
        mag(s.N) {
        std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
        std::vector<float>                    x(s.K);
        for (auto & v : w) v = __float2half(ud(rng));
        for (auto & v : x) v = ud(rng);
        CHECK_CUDA(cudaMalloc(&dw, bytes * copies));
        CHECK_CUDA(cudaMalloc(&dx, s.K * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&dy, s.N * sizeof(float)));
        for (int c = 0; c < copies; ++c) {
            CHECK_CUDA(cudaMemcpy((char *) dw + bytes * c, w.data(), bytes, cudaMemcpyHostToDevice));
        }
        CHECK_CUDA(cudaMemcpy(dx, x.data(), s.K * sizeof(float), cudaMemcpyHostToDevice));
        for (int n = 0; n < s.N; ++n) {
            for (int k = 0; k < s.K; ++k) {
                const double p = (double) __half2float(w[(size_t) n * s.K + k]) * x[k];
                ref[n] += p;
                mag[n] += std::fabs(p);
            }
        }
    }

    ~problem() {
        CHECK_CUDA(cudaFree(dw));
        CHECK_CUDA(cudaFree(dx));
        CHECK_CUDA(cudaFree(dy));
    }

    problem(const problem &)             = delete;
    problem & operator=(const problem &) = delete;

    const half * copy(int c) const { return (const half *) ((const char *) dw + bytes * c); }

    // the worst row's error over its sum of |w x|, one launch of v
    double check(const variant & v, cudaStream_t st) const {
        std::vector<float> y(s.N);
        CHECK_CUDA(cudaMemset(dy, 0xff, s.N * sizeof(float)));
        launch(v, dw, dx, dy, s.N, s.K, st);
        CHECK_CUDA(cudaStreamSynchronize(st));
        CHECK_CUDA(cudaMemcpy(y.data(), dy, s.N * sizeof(float), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int n = 0; n < s.N; ++n) {
            const double e = std::fabs((double) y[n] - ref[n]) / (mag[n] + 1e-30);
            worst          = std::isfinite(e) ? std::max(worst, e) : INFINITY;
        }
        return worst;
    }

    // us a launch: the median of 20 graphs of 20 launches, the graphs taking turns over the copies
    std::vector<float> time(const variant & v, cudaStream_t st) const {
        std::vector<cudaGraphExec_t> execs(copies / 20);
        for (size_t g = 0; g < execs.size(); ++g) {
            cudaGraph_t graph;
            CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < 20; ++i) {
                launch(v, copy((int) g * 20 + i), dx, dy, s.N, s.K, st);
            }
            CHECK_CUDA(cudaStreamEndCapture(st, &graph));
            CHECK_CUDA(cudaGraphInstantiate(&execs[g], graph, 0));
            CHECK_CUDA(cudaGraphDestroy(graph));
        }
        for (cudaGraphExec_t e : execs) CHECK_CUDA(cudaGraphLaunch(e, st));
        CHECK_CUDA(cudaStreamSynchronize(st));
        cudaEvent_t e0, e1;
        CHECK_CUDA(cudaEventCreate(&e0));
        CHECK_CUDA(cudaEventCreate(&e1));
        std::vector<float> us;
        for (int rep = 0; rep < 20; ++rep) {
            CHECK_CUDA(cudaEventRecord(e0, st));
            CHECK_CUDA(cudaGraphLaunch(execs[rep % execs.size()], st));
            CHECK_CUDA(cudaEventRecord(e1, st));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            us.push_back(1e3f * ms / 20);
        }
        std::sort(us.begin(), us.end());
        CHECK_CUDA(cudaEventDestroy(e0));
        CHECK_CUDA(cudaEventDestroy(e1));
        for (cudaGraphExec_t e : execs) CHECK_CUDA(cudaGraphExecDestroy(e));
        return us;
    }
};

}  // namespace

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs, %d MB L2; one-column f16 products\n", prop.name, prop.multiProcessorCount,
                prop.l2CacheSize >> 20);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    std::mt19937 rng(11);
    for (const shape & s : SHAPES) {  // every check before any timing
        const problem p(s, rng);
        for (const variant & v : VARIANTS) {
            if (!runs_here(v)) continue;
            const double worst = p.check(v, st);
            const bool   ok    = worst <= 1e-4;
            std::printf("%d x %d, %s: check %s (worst row error %.1e of its sum of |w x|)\n", s.N, s.K, v.name,
                        ok ? "ok" : "FAILED", worst);
            if (!ok) {
                std::printf("CHECKS FAILED\n");
                return 1;
            }
        }
    }
    std::printf("\nus a launch (median of 20 graphs of 20, each launch on weights of its own) and GB/s of weights\n");
    for (const shape & s : SHAPES) {
        const problem p(s, rng);
        std::printf("\n%d x %d (%s), %.2f MB of weights, %d copies:\n", s.N, s.K, s.what, p.bytes / 1e6, p.copies);
        for (const variant & v : VARIANTS) {
            if (!runs_here(v)) {
                std::printf("  %s  not schedulable here\n", v.name);
                continue;
            }
            const std::vector<float> us = p.time(v, st);
            std::printf("  %s  %8.2f us (%.2f-%.2f)  %7.1f GB/s\n", v.name, us[10], us.front(), us.back(),
                        p.bytes / (us[10] * 1e3));
        }
    }
    std::printf("\nall checks passed\n");
    return 0;
}
