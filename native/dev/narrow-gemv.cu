// Dev corner (see README.md here): one-column f16 products of the decode step's narrow shapes,
// whose weights a step reads far below the card's bandwidth, before a split-K form moves into
// native/ggml/cuda/gemv-f16.cu.
//
// At one sequence the 8K step's profile (bench/results/2026-12-05-a416b12-kernels.txt, H100) has
// 289 launches of upstream's MMVF (`mul_mat_vec_f<half, half>`, 2.16 ms of 8.37): the products
// with too few rows for pyqsa's gemv, the hyper-connection norms' down product (320 rows of
// 10240) the largest; and the MoE experts' products of one token read ~350-460 GB/s in
// test-products. A warp a row over the whole K leaves the card mostly idle when N is a few
// hundred: 320 rows are 40 CTAs of 8 warps on 132 SMs. Variants, y[n] = sum_k w[n, k] x[k], one
// column, f16 w, f32 x and y, f32 sums:
//   A  the library's form: a warp takes R rows over the whole K (R as its rows_per_warp picks),
//      each lane's 16-byte chunks in order, then the warp's butterfly
//   U  upstream's MMVF form: a CTA of 256 threads a row, then the CTA's reduction
//   S  split K: grid (row blocks, S slices), a warp takes R rows over one slice, the partial
//      sums to a workspace; the CTA that finishes a row block last (a counter per block, which
//      it resets) adds the S partials in slice order. One launch, and the same bits every run:
//      each partial is summed in a fixed order and so are the partials.
//   C  split K over a thread-block cluster (Hopper): the S CTAs of a cluster take the S slices of
//      one row block, and the first adds the others' partial sums in rank order from their
//      shared memory (distributed shared memory): one launch, no workspace, no counters, the same
//      bits every run; S a power of two up to 8 (the portable cluster size).
// Each shape runs in a CUDA graph of 96 launches over 96 copies of the weights (a step's count
// of hyper-connection mixes; the copies keep the reads out of L2), checked first against a
// double-precision reference (and S against itself: the same bits twice).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a native/dev/narrow-gemv.cu -o /tmp/narrow-gemv && /tmp/narrow-gemv
#include "cuda-check.cuh"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int WARPS  = 8;
constexpr int CHUNK  = 8;  // halves a lane loads at once: 16 bytes
constexpr int COPIES = 96;

struct shape {
    const char * name;
    int          N, K;
};

// N rows, K columns: what one launch of the step reads
constexpr shape SHAPES[] = {
    { "hyper-connection down (320 x 10240)", 320, 10240 },
    { "MoE gate or up, 2 experts of 512 x 2560", 1024, 2560 },
    { "MoE down, 2 experts of 2560 x 512", 5120, 512 },
    { "linear attention alpha (32 x 2560)", 32, 2560 },
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) {
        v += __shfl_xor_sync(0xffffffff, v, o);
    }
    return v;
}

// a lane's dot product over chunks [c0, c1) of one row, its chunks in order
template <int R>
__device__ __forceinline__ void row_dots(const __half * w, const size_t (&row_off)[R], const float * x, int c0, int c1,
                                         float (&acc)[R]) {
    const int lane = threadIdx.x % 32;
#pragma unroll 4
    for (int c = c0 + lane; c < c1; c += 32) {
        uint4 v[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            v[r] = __ldcs((const uint4 *) (w + row_off[r]) + c);
        }
        const float4 x0        = __ldg((const float4 *) (x + c * CHUNK));
        const float4 x1        = __ldg((const float4 *) (x + c * CHUNK) + 1);
        const float  xf[CHUNK] = { x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w };
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const half2 * h = (const half2 *) &v[r];
#pragma unroll
            for (int i = 0; i < CHUNK / 2; ++i) {
                const float2 f = __half22float2(h[i]);
                acc[r]         = fmaf(f.x, xf[2 * i], acc[r]);
                acc[r]         = fmaf(f.y, xf[2 * i + 1], acc[r]);
            }
        }
    }
}

// A: grid (ceil(N / (WARPS R))), a warp R rows over the whole K
template <int R> __global__ void __launch_bounds__(WARPS * 32) a_gemv(const __half * w, const float * x, float * y, int N, int K) {
    const int row0 = (blockIdx.x * WARPS + threadIdx.x / 32) * R;
    if (row0 >= N) {
        return;
    }
    size_t row_off[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        row_off[r] = (size_t) min(row0 + r, N - 1) * K;
    }
    float acc[R] = {};
    row_dots<R>(w, row_off, x, 0, K / CHUNK, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = warp_sum(acc[r]);
        if (threadIdx.x % 32 == 0 && row0 + r < N) {
            y[row0 + r] = acc[r];
        }
    }
}

// U: grid (N), a CTA of 256 threads a row
__global__ void __launch_bounds__(256) u_gemv(const __half * w, const float * x, float * y, int N, int K) {
    const size_t row_off[1] = { (size_t) blockIdx.x * K };
    float        acc[1]     = {};
    // the CTA's 8 warps take interleaved ranges of 32 chunks
    const int    n_chunks   = K / CHUNK;
    const int    warp       = threadIdx.x / 32;
    for (int c0 = warp * 32; c0 < n_chunks; c0 += WARPS * 32) {
        row_dots<1>(w, row_off, x, c0, min(c0 + 32, n_chunks), acc);
    }
    __shared__ float part[WARPS];
    acc[0] = warp_sum(acc[0]);
    if (threadIdx.x % 32 == 0) {
        part[warp] = acc[0];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < WARPS; ++i) {
            s += part[i];
        }
        y[blockIdx.x] = s;
    }
}

// S: grid (row blocks, S), a warp R rows over slice blockIdx.y of K; partial [S][N], count
// [row blocks] (zero between launches: the last CTA of a block resets it)
template <int R>
__global__ void __launch_bounds__(WARPS * 32)
    s_gemv(const __half * w, const float * x, float * y, int N, int K, float * partial, unsigned * count) {
    const int S        = gridDim.y;
    const int n_chunks = K / CHUNK;
    const int per      = (n_chunks + S - 1) / S;
    const int c0       = blockIdx.y * per;
    const int c1       = min(c0 + per, n_chunks);
    const int row0     = (blockIdx.x * WARPS + threadIdx.x / 32) * R;
    if (row0 < N) {
        size_t row_off[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            row_off[r] = (size_t) min(row0 + r, N - 1) * K;
        }
        float acc[R] = {};
        row_dots<R>(w, row_off, x, c0, c1, acc);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = warp_sum(acc[r]);
            if (threadIdx.x % 32 == 0 && row0 + r < N) {
                partial[(size_t) blockIdx.y * N + row0 + r] = acc[r];
            }
        }
    }
    // the last of the block's S CTAs adds the partials, slice by slice
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&count[blockIdx.x], 1u) == (unsigned) S - 1;
    }
    __syncthreads();
    if (!last) {
        return;
    }
    __threadfence();
    const int first = blockIdx.x * WARPS * R;
    for (int n = first + threadIdx.x; n < min(first + WARPS * R, N); n += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < S; ++j) {
            s += __ldcg(partial + (size_t) j * N + n);
        }
        y[n] = s;
    }
    if (threadIdx.x == 0) {
        count[blockIdx.x] = 0;
    }
}

// C: grid (row blocks, S) in clusters of (1, S), a warp one row over slice `rank` of K
template <int S>
__global__ void __cluster_dims__(1, S, 1) __launch_bounds__(WARPS * 32)
    c_gemv(const __half * w, const float * x, float * y, int N, int K) {
    namespace cg                 = cooperative_groups;
    const cg::cluster_group clu  = cg::this_cluster();
    const int               rank = (int) clu.block_rank();
    const int               n_chunks = K / CHUNK;
    const int               per      = (n_chunks + S - 1) / S;
    const int               c0       = rank * per;
    const int               row      = blockIdx.x * WARPS + threadIdx.x / 32;
    __shared__ float        part[WARPS];
    const size_t            row_off[1] = { (size_t) min(row, N - 1) * K };
    float                   acc[1]     = {};
    row_dots<1>(w, row_off, x, c0, min(c0 + per, n_chunks), acc);
    acc[0] = warp_sum(acc[0]);
    if (threadIdx.x % 32 == 0) {
        part[threadIdx.x / 32] = acc[0];
    }
    clu.sync();
    if (rank == 0 && threadIdx.x < WARPS && blockIdx.x * WARPS + threadIdx.x < N) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < S; ++j) {
            sum += *clu.map_shared_rank(&part[threadIdx.x], j);
        }
        y[blockIdx.x * WARPS + threadIdx.x] = sum;
    }
    clu.sync();  // the other CTAs' shared memory stays until the first has read it
}

// the library's choice of rows a warp: the most that still gives every SM two CTAs
int rows_per_warp(int N, int n_sm) {
    for (int r : { 4, 2 }) {
        if ((N + WARPS * r - 1) / (WARPS * r) >= 2 * n_sm) {
            return r;
        }
    }
    return 1;
}

// split K into the fewest slices that give every SM two CTAs, each slice at least two chunks a
// lane (K / CHUNK / 64)
int slices(int N, int K, int R, int n_sm) {
    const int blocks = (N + WARPS * R - 1) / (WARPS * R);
    const int most   = std::max(1, K / CHUNK / 64);
    return std::min(most, std::max(1, (2 * n_sm + blocks - 1) / blocks));
}

struct launch_plan {
    char     variant;  // 'A', 'U', 'S', 'C'
    int      R, S;
    float *  partial;
    unsigned * count;
};

void run(const launch_plan & p, const __half * w, const float * x, float * y, int N, int K, cudaStream_t st) {
    const int blocks = (N + WARPS * p.R - 1) / (WARPS * p.R);
    if (p.variant == 'U') {
        u_gemv<<<N, 256, 0, st>>>(w, x, y, N, K);
        return;
    }
    if (p.variant == 'C') {
        const dim3 grid((N + WARPS - 1) / WARPS, p.S);
        switch (p.S) {
            case 2: c_gemv<2><<<grid, WARPS * 32, 0, st>>>(w, x, y, N, K); break;
            case 4: c_gemv<4><<<grid, WARPS * 32, 0, st>>>(w, x, y, N, K); break;
            default: c_gemv<8><<<grid, WARPS * 32, 0, st>>>(w, x, y, N, K); break;
        }
        return;
    }
    if (p.variant == 'S') {  // a warp a row: the slices, not more rows, fill the card
        s_gemv<1><<<dim3(blocks, p.S), WARPS * 32, 0, st>>>(w, x, y, N, K, p.partial, p.count);
        return;
    }
    switch (p.R) {
        case 1: a_gemv<1><<<blocks, WARPS * 32, 0, st>>>(w, x, y, N, K); break;
        case 2: a_gemv<2><<<blocks, WARPS * 32, 0, st>>>(w, x, y, N, K); break;
        default: a_gemv<4><<<blocks, WARPS * 32, 0, st>>>(w, x, y, N, K); break;
    }
}

template <typename T> T * upload(const std::vector<T> & v) {
    T * d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

std::vector<float> download(const float * d, size_t n) {
    std::vector<float> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

// median us a launch over 20 replays of a graph of COPIES launches (3 more replays first)
template <typename F> float median_us(F && capture, cudaStream_t st) {
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    capture();
    CHECK_CUDA(cudaStreamEndCapture(st, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    std::vector<float> us;
    for (int i = 0; i < 23; ++i) {
        CHECK_CUDA(cudaEventRecord(a, st));
        CHECK_CUDA(cudaGraphLaunch(exec, st));
        CHECK_CUDA(cudaEventRecord(b, st));
        CHECK_CUDA(cudaEventSynchronize(b));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        if (i >= 3) {
            us.push_back(ms * 1000.0f / COPIES);
        }
    }
    std::sort(us.begin(), us.end());
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    return us[us.size() / 2];
}

bool study(const shape & sh, int n_sm, cudaStream_t st) {
    const int                       N = sh.N, K = sh.K;
    std::mt19937                    rng(N + K);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<__half>             hw((size_t) N * K);
    for (auto & v : hw) {
        v = __float2half(nd(rng) / std::sqrt((float) K));
    }
    std::vector<float> hx(K);
    for (float & v : hx) {
        v = nd(rng);
    }
    std::vector<double> ref(N);
    double              mag = 0.0;
    for (int n = 0; n < N; ++n) {
        double s = 0.0;
        for (int k = 0; k < K; ++k) {
            s += (double) __half2float(hw[(size_t) n * K + k]) * hx[k];
        }
        ref[n] = s;
        mag    = std::max(mag, std::fabs(s));
    }
    std::vector<__half *> w(COPIES);
    for (auto & p : w) {
        p = upload(hw);
    }
    float * x = upload(hx);
    float * y = nullptr;
    CHECK_CUDA(cudaMalloc(&y, (size_t) COPIES * N * sizeof(float)));

    const int   R_lib = rows_per_warp(N, n_sm);
    const int   R_s   = 1;
    const int   S     = slices(N, K, R_s, n_sm);
    float *     partial;
    unsigned *  count;
    const int   blocks_s = (N + WARPS * R_s - 1) / (WARPS * R_s);
    CHECK_CUDA(cudaMalloc(&partial, (size_t) COPIES * S * N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&count, (size_t) COPIES * blocks_s * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(count, 0, (size_t) COPIES * blocks_s * sizeof(unsigned)));
    int S_c = 2;  // C's slices: the power of two at or above S, at most 8
    while (S_c < S && S_c < 8) {
        S_c *= 2;
    }
    const launch_plan plans[4] = { { 'A', R_lib, 1, nullptr, nullptr }, { 'U', 1, 1, nullptr, nullptr },
                                   { 'S', R_s, S, partial, count }, { 'C', 1, S_c, nullptr, nullptr } };
    const double bytes = (double) N * K * sizeof(__half);
    std::printf("%s: %.2f MB of weights, A with %d row(s) a warp, S with %d slice(s) of K, C with %d\n", sh.name,
                bytes / 1e6, R_lib, S, S_c);
    bool ok = true;
    std::vector<float> first;
    for (const launch_plan & p : plans) {
        for (int rep = 0; rep < 2; ++rep) {
            run(p, w[0], x, y, N, K, st);
            CHECK_CUDA(cudaGetLastError());
            CHECK_CUDA(cudaStreamSynchronize(st));
            const std::vector<float> got = download(y, N);
            if (rep == 0) {
                double err = 0.0;
                for (int n = 0; n < N; ++n) {
                    err = std::max(err, std::fabs(got[n] - ref[n]));
                }
                const bool pass = err / mag < 1e-4;
                std::printf("  %c: rel err %.2e: %s\n", p.variant, err / mag, pass ? "ok" : "FAILED");
                ok    = ok && pass;
                first = got;
            } else if (std::memcmp(first.data(), got.data(), N * sizeof(float)) != 0) {
                std::printf("  %c: a second run gave other bits: FAILED\n", p.variant);
                ok = false;
            }
        }
    }
    if (ok) {
        float us[4];
        for (int i = 0; i < 4; ++i) {
            us[i] = median_us(
                [&] {
                    for (int c = 0; c < COPIES; ++c) {
                        launch_plan p = plans[i];
                        p.partial     = partial + (size_t) c * S * N;
                        p.count       = count + (size_t) c * blocks_s;
                        run(p, w[c], x, y + (size_t) c * N, N, K, st);
                    }
                },
                st);
        }
        std::printf("  us a launch (graph of %d, median of 20):", COPIES);
        for (int i = 0; i < 4; ++i) {
            std::printf(" %c %.2f (%.0f GB/s)%s", plans[i].variant, us[i], bytes / us[i] / 1e3, i < 3 ? "," : "\n");
        }
    }
    for (auto p : w) {
        CHECK_CUDA(cudaFree(p));
    }
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(partial));
    CHECK_CUDA(cudaFree(count));
    return ok;
}

}  // namespace

int main() {
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("narrow-gemv on %s (%d SMs): one column, f16 weights, f32 sums\n", prop.name, prop.multiProcessorCount);
    bool ok = true;
    for (const shape & sh : SHAPES) {
        ok = study(sh, prop.multiProcessorCount, st) && ok;
    }
    return ok ? 0 : 1;
}
