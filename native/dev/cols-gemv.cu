// Dev corner (see README.md here): f16 products of 2-8 activation columns, a decode step of 8
// sequences, at the step's shapes, before a faster form moves into native/ggml/cuda/gemv-f16.cu.
//
// At 8 x 32K a step reads 9.43 GB of weights (decode.py's weight_bytes, full-shape model): 2.8 ms
// at the H100's 3.35 TB/s, where the step takes 12.6 ms. The library's 2-8 column kernel,
// `gemv_f16_cols`, is 8.8 of the 13.4 ms of kernels a profiled step has (579 launches; bench/
// results/2026-12-05-a416b12-kernels.txt): about 1 TB/s. The profile gives time by kernel name
// only; this study times each shape of the step on its own (GB/s of the weights a launch reads),
// the library's form and rule against other forms and a proposed rule. A form is (W, RG, S):
// a CTA of W warps takes 16 x RG rows and every column, its warps splitting K (warp w takes
// k-steps w, w + W, ...), each lane loading 16 bytes of two rows and 32 of its column's x a k-step
// into m16n8k16 products; the warps' sums added in shared memory in warp order; with S > 1, K in
// S equal shares over a thread-block cluster's CTAs, the cluster's first CTA adding their sums in
// rank order from their shared memory (one launch, no workspace, the same bits every run). The k
// loop is `#pragma unroll 4`, the compiler's to schedule.
//   A1, A2  8 warps, 16 or 32 rows;  B1, B2  4 warps;  F2, F4  2 warps, 32 or 64 rows
//   D2, D4, D8  8 warps, 16 rows, clusters of 2, 4, 8;  C4, C8  the same with 4 warps
//   L  the library's rule: A2 where 32-row blocks still give every SM two CTAs, else A1
//   R  the proposed rule (proposed_form): about 20 warps a SM, fewer warps a CTA for a grid of
//      more, K split over a cluster for a dense grid of fewer than half that
// (An earlier run had an explicit 4- and 8-step register pipeline in A's loop: slower than A at
// every shape but one, 1024 x 2560, where the clusters did as well.)
// MoE shapes run as the library runs MUL_MAT_ID at 2-8 tokens: grid (row blocks, slots), the CTA
// of slot j finds the j-th distinct expert among the (token, used) pairs on the device and
// multiplies its rows by the x of every pair routed to it.
// All launches use programmatic dependent launch as the library does (dense weights prefetched to
// L2 before the wait). Each shape runs in a CUDA graph over enough copies of its weights to keep
// the reads out of L2, checked first against a double-precision reference of the f16-rounded x
// (as the library rounds it).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda native/dev/cols-gemv.cu -o /tmp/cols-gemv && /tmp/cols-gemv
#include "cuda-check.cuh"
#include "mma-ptx.cuh"  // native/ggml/cuda: -Inative/ggml/cuda

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

constexpr int KB        = 32;   // k of a lane-step: 8 halves for each lane of a quad
constexpr int MAX_SLOTS = 256;  // n_used * n_tok
constexpr int T         = 8;    // activation columns (tokens)

struct args {
    const __half * w;      // [n_expert][N][K]
    size_t         w_nb2;  // halves between experts
    const float *  x;      // x of pair p = (t, u): x + (t * x_ne1 + u % x_ne1) * K
    int            x_ne1;
    float *        y;      // y of pair p: y + p * N
    const int *    ids;    // [n_tok][n_used]; nullptr: dense (expert 0, n_used 1)
    int            n_used, n_tok, N, K;
};

__device__ __forceinline__ void pdl_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void pdl_launch() {
    asm volatile("griddepcontrol.launch_dependents;");
}

// the 4 b registers of a lane-step: 8 halves of x at k, rounded to f16 (zeros past the columns)
__device__ __forceinline__ void x_regs(uint32_t (&b)[4], const float4 & x0, const float4 & x1) {
    const half2 h[4] = { __floats2half2_rn(x0.x, x0.y), __floats2half2_rn(x0.z, x0.w), __floats2half2_rn(x1.x, x1.y),
                         __floats2half2_rn(x1.z, x1.w) };
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        b[i] = *(const uint32_t *) &h[i];
    }
}

// lane (g, t)'s 8 halves at k of rows g and g + 8 of each 16-row group, as A of two products
template <int RG> __device__ __forceinline__ void mma_step(float (&d)[RG][4], const uint4 (&wv)[RG][2], const uint32_t (&b)[4]) {
#pragma unroll
    for (int i = 0; i < RG; ++i) {
        const uint32_t a0[4] = { wv[i][0].x, wv[i][1].x, wv[i][0].y, wv[i][1].y };
        const uint32_t a1[4] = { wv[i][0].z, wv[i][1].z, wv[i][0].w, wv[i][1].w };
        pyqsa_mma::mma_f16(d[i], a0, b[0], b[1]);
        pyqsa_mma::mma_f16(d[i], a1, b[2], b[3]);
    }
}

// W warps, 16 RG rows a CTA;
// SPLIT: K split over the CTAs of the launch's clusters (grid x: row blocks times cluster size)
template <int W, int RG, bool SPLIT> __global__ void __launch_bounds__(W * 32) cols(const args a) {
    __shared__ int   pairs[MAX_SLOTS];
    __shared__ int   expert_of[MAX_SLOTS];
    __shared__ int   n_pairs, expert;
    __shared__ float partial[W][RG * 16][8];
    const int        lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int        g = lane / 4, t = lane % 4;
    namespace cg = cooperative_groups;
    const int        S       = SPLIT ? (int) cg::this_cluster().num_blocks() : 1;
    const int        rank    = SPLIT ? (int) cg::this_cluster().block_rank() : 0;
    const int        row0    = blockIdx.x / S * RG * 16;
    const int        n_slots = a.n_used * a.n_tok;
    const int        kbeg    = a.K / S * rank, kend = kbeg + a.K / S;  // K % (S KB) == 0
    __shared__ float sum_cta[SPLIT ? RG * 16 : 1][8];

    size_t row_off[RG][2];
#pragma unroll
    for (int i = 0; i < RG; ++i) {
        row_off[i][0] = (size_t) min(row0 + 16 * i + g, a.N - 1) * a.K;
        row_off[i][1] = (size_t) min(row0 + 16 * i + g + 8, a.N - 1) * a.K;
    }
    if (a.ids == nullptr) {
#pragma unroll
        for (int i = 0; i < RG; ++i) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + row_off[i][j] + kbeg + warp * KB + t * 8));
            }
        }
    }
    pdl_wait();
    if (a.ids == nullptr) {
        if (threadIdx.x < n_slots) {
            pairs[threadIdx.x] = threadIdx.x;
        }
        if (threadIdx.x == 0) {
            n_pairs = n_slots;
            expert  = 0;
        }
    } else {
        for (int p = threadIdx.x; p < n_slots; p += blockDim.x) {
            expert_of[p] = a.ids[p];
        }
        __syncthreads();
        for (int p = threadIdx.x; p < n_slots; p += blockDim.x) {
            bool first = true;
            for (int q = 0; q < p && first; ++q) {
                first = expert_of[q] != expert_of[p];
            }
            pairs[p] = first;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int e = -1;
            for (int p = 0, seen = 0; p < n_slots && e < 0; ++p) {
                if (pairs[p] && seen++ == (int) blockIdx.y) {
                    e = expert_of[p];
                }
            }
            int n = 0;
            for (int p = 0; p < n_slots && e >= 0; ++p) {
                if (expert_of[p] == e) {
                    pairs[n++] = p;
                }
            }
            expert  = e;
            n_pairs = n;
        }
    }
    __syncthreads();
    if (expert < 0) {
        return;
    }
    const __half * w    = a.w + (size_t) expert * a.w_nb2;
    constexpr int  STEP = W * KB;
    for (int c0 = 0; c0 < n_pairs; c0 += 8) {
        const int     nc = min(8, n_pairs - c0);
        const float * x  = nullptr;
        if (g < nc) {
            const int p = pairs[c0 + g];
            x           = a.x + ((size_t) (p / a.n_used) * a.x_ne1 + (p % a.n_used) % a.x_ne1) * a.K;
        }
        float d[RG][4] = {};
#pragma unroll 4
        for (int k0 = kbeg + warp * KB; k0 < kend; k0 += STEP) {
            const int k = k0 + t * 8;
            uint4     wv[RG][2];
#pragma unroll
            for (int i = 0; i < RG; ++i) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    wv[i][j] = __ldcs((const uint4 *) (w + row_off[i][j] + k));
                }
            }
            uint32_t b[4] = {};
            if (x != nullptr) {
                x_regs(b, __ldg((const float4 *) (x + k)), __ldg((const float4 *) (x + k) + 1));
            }
            mma_step<RG>(d, wv, b);
        }
#pragma unroll
        for (int i = 0; i < RG; ++i) {
            partial[warp][16 * i + g][2 * t]         = d[i][0];
            partial[warp][16 * i + g][2 * t + 1]     = d[i][1];
            partial[warp][16 * i + g + 8][2 * t]     = d[i][2];
            partial[warp][16 * i + g + 8][2 * t + 1] = d[i][3];
        }
        __syncthreads();
        for (int o = threadIdx.x; o < RG * 16 * 8; o += blockDim.x) {
            const int r = o / 8, c = o % 8;
            if (c < nc && row0 + r < a.N) {
                float sum = 0.0f;
#pragma unroll
                for (int v = 0; v < W; ++v) {
                    sum += partial[v][r][c];
                }
                if constexpr (SPLIT) {
                    sum_cta[r][c] = sum;
                } else {
                    a.y[(size_t) pairs[c0 + c] * a.N + row0 + r] = sum;
                }
            }
        }
        if constexpr (SPLIT) {
            cg::this_cluster().sync();
            if (rank == 0) {
                for (int o = threadIdx.x; o < RG * 16 * 8; o += blockDim.x) {
                    const int r = o / 8, c = o % 8;
                    if (c < nc && row0 + r < a.N) {
                        float sum = 0.0f;
                        for (int q = 0; q < S; ++q) {
                            sum += cg::this_cluster().map_shared_rank(&sum_cta[0][0], q)[o];
                        }
                        a.y[(size_t) pairs[c0 + c] * a.N + row0 + r] = sum;
                    }
                }
            }
            cg::this_cluster().sync();  // no CTA leaves (or reuses sum_cta) before the first has read it
        }
        __syncthreads();
    }
    pdl_launch();
}

// a launch's form: W warps a CTA, 16 RG rows a CTA, K split over clusters of S CTAs
struct form {
    int W, RG, S;
};

// how a variant picks its form: fixed, the library's rule, or the rule proposed here
enum class pick { fixed, library, proposed };

struct variant {
    const char * name;
    form         f;
    pick         how;
};

constexpr variant VARIANTS[] = {
    { "A1", { 8, 1, 1 }, pick::fixed },  { "A2", { 8, 2, 1 }, pick::fixed },  { "B1", { 4, 1, 1 }, pick::fixed },
    { "B2", { 4, 2, 1 }, pick::fixed },  { "F2", { 2, 2, 1 }, pick::fixed },  { "F4", { 2, 4, 1 }, pick::fixed },
    { "D2", { 8, 1, 2 }, pick::fixed },  { "D4", { 8, 1, 4 }, pick::fixed },  { "D8", { 8, 1, 8 }, pick::fixed },
    { "C4", { 4, 1, 4 }, pick::fixed },  { "C8", { 4, 1, 8 }, pick::fixed },  { "L", {}, pick::library },
    { "R", {}, pick::proposed },
};

int blocks_of(const args & a, int rg) {
    return (a.N + 16 * rg - 1) / (16 * rg);
}

// the library's: A2 where 32-row blocks still give every SM two CTAs, else A1
form library_form(const args & a, int grid_y, int n_sm) {
    return { 8, blocks_of(a, 2) * grid_y >= 2 * n_sm ? 2 : 1, 1 };
}

// proposed: about 20 warps a SM. A grid of more gets fewer warps a CTA (dense: 4; MoE, whose every
// CTA first finds its expert's pairs: 4, then 32 rows, then 2 warps, then 64 rows); a dense grid
// of fewer than half that splits K over a cluster (2, 4, 8 CTAs) while each CTA keeps >= 512 of K
form proposed_form(const args & a, int grid_y, int n_sm) {
    const int  target = 20 * n_sm;
    const bool moe    = a.ids != nullptr;
    const auto warps  = [&](const form & f) { return (long) blocks_of(a, f.RG) * grid_y * f.W * f.S; };
    form       f      = { 8, 1, 1 };
    const form fewer[] = { { 4, 1, 1 }, { 4, 2, 1 }, { 2, 2, 1 }, { 2, 4, 1 } };
    for (int i = 0; i < (moe ? 4 : 1) && warps(f) > target; ++i) {
        f = fewer[i];
    }
    while (!moe && f.S < 8 && 2 * warps(f) < target && a.K % (2 * f.S * KB) == 0 && a.K / (2 * f.S) >= 512) {
        f.S *= 2;
    }
    return f;
}

form form_of(const variant & v, const args & a, int grid_y, int n_sm) {
    switch (v.how) {
        case pick::library: return library_form(a, grid_y, n_sm);
        case pick::proposed: return proposed_form(a, grid_y, n_sm);
        default: return v.f;
    }
}

// a split must leave each CTA whole lane-steps
bool runs(const form & f, const args & a) {
    return a.K % (f.S * KB) == 0;
}

void launch(const form & f, const args & a, int grid_y, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim            = dim3(blocks_of(a, f.RG) * f.S, grid_y);
    cfg.blockDim           = dim3(f.W * 32);
    cfg.stream             = s;
    cudaLaunchAttribute attr[2];
    attr[0].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id                                         = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x                           = f.S;
    attr[1].val.clusterDim.y                           = 1;
    attr[1].val.clusterDim.z                           = 1;
    cfg.attrs                                          = attr;
    cfg.numAttrs                                       = f.S > 1 ? 2 : 1;
#define PYQSA_LAUNCH(W_, RG_, SPLIT_)                                   \
    if (f.W == W_ && f.RG == RG_ && (f.S > 1) == SPLIT_) {              \
        CHECK_CUDA(cudaLaunchKernelEx(&cfg, cols<W_, RG_, SPLIT_>, a)); \
        return;                                                         \
    }
    PYQSA_LAUNCH(8, 1, false)
    PYQSA_LAUNCH(8, 2, false)
    PYQSA_LAUNCH(4, 1, false)
    PYQSA_LAUNCH(4, 2, false)
    PYQSA_LAUNCH(2, 2, false)
    PYQSA_LAUNCH(2, 4, false)
    PYQSA_LAUNCH(8, 1, true)
    PYQSA_LAUNCH(4, 1, true)
#undef PYQSA_LAUNCH
    std::fprintf(stderr, "no kernel for W %d RG %d S %d\n", f.W, f.RG, f.S);
    std::exit(1);
}

struct shape {
    const char * name;
    int          N, K;
    int          n_expert, n_used;  // n_expert 0: dense
    bool         x_per_pair;        // MoE down: each pair its own x row (x_ne1 = n_used)
};

// the 8-column launches of a Flash-Next step (full-shape synthetic model; the MoE also at the
// real model's 512 experts top-10)
constexpr shape SHAPES[] = {
    { "linear attention in-proj 12288 x 2560", 12288, 2560, 0, 0, false },
    { "linear attention out 2560 x 4096", 2560, 4096, 0, 0, false },
    { "QSA out 2560 x 6144", 2560, 6144, 0, 0, false },
    { "shared expert gate+up 1024 x 2560", 1024, 2560, 0, 0, false },
    { "shared expert down 2560 x 512", 2560, 512, 0, 0, false },
    { "hyper-connection down and inject 324 x 10240", 324, 10240, 0, 0, false },
    { "hyper-connection up 10240 x 320", 10240, 320, 0, 0, false },
    { "output 151936 x 2560", 151936, 2560, 0, 0, false },
    { "MoE gate, 8 experts top-2, 512 x 2560", 512, 2560, 8, 2, false },
    { "MoE down, 8 experts top-2, 2560 x 512", 2560, 512, 8, 2, true },
    { "MoE gate, 512 experts top-10, 512 x 2560", 512, 2560, 512, 10, false },
    { "MoE down, 512 experts top-10, 2560 x 512", 2560, 512, 512, 10, true },
};

constexpr size_t MIN_BYTES = 512ull << 20;  // a graph's weights: well past the 50 MB L2

}  // namespace

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs; %d columns, us a launch (median of 20 graphs) and GB/s of the weights read\n", prop.name,
                prop.multiProcessorCount, T);
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    std::mt19937 rng(7);
    std::vector<std::vector<float>> table;
    for (const shape & sh : SHAPES) {
        const bool   moe      = sh.n_expert > 0;
        const int    n_expert = moe ? sh.n_expert : 1;
        const int    n_used   = moe ? sh.n_used : 1;
        const size_t one      = (size_t) n_expert * sh.N * sh.K;  // halves of one copy
        // ids: each token's n_used distinct experts
        std::vector<int> ids;
        if (moe) {
            for (int t = 0; t < T; ++t) {
                std::vector<int> e(n_expert);
                for (int i = 0; i < n_expert; ++i) {
                    e[i] = i;
                }
                std::shuffle(e.begin(), e.end(), rng);
                ids.insert(ids.end(), e.begin(), e.begin() + n_used);
            }
        }
        std::vector<int> used(ids);
        std::sort(used.begin(), used.end());
        used.erase(std::unique(used.begin(), used.end()), used.end());
        const size_t read   = (size_t) (moe ? used.size() : 1) * sh.N * sh.K * 2;  // bytes a launch reads
        const int    copies = (int) std::min<size_t>(96, std::max<size_t>(1, MIN_BYTES / (one * 2) + 1));
        const int    x_ne1  = sh.x_per_pair ? n_used : 1;
        const int    pairs  = n_used * T;

        std::vector<__half> w(one);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (auto & v : w) {
            v = __float2half(u(rng));
        }
        std::vector<float> x((size_t) T * x_ne1 * sh.K);
        for (auto & v : x) {
            v = u(rng);
        }
        __half * dw;
        float *  dx;
        float *  dy;
        int *    dids = nullptr;
        CHECK_CUDA(cudaMalloc(&dw, one * 2 * copies));
        for (int c = 0; c < copies; ++c) {
            CHECK_CUDA(cudaMemcpy(dw + one * c, w.data(), one * 2, cudaMemcpyHostToDevice));
        }
        CHECK_CUDA(cudaMalloc(&dx, x.size() * 4));
        CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMalloc(&dy, (size_t) pairs * sh.N * 4));
        if (moe) {
            CHECK_CUDA(cudaMalloc(&dids, ids.size() * 4));
            CHECK_CUDA(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        }
        const int grid_y = moe ? std::min(pairs, n_expert) : 1;
        args      a      = { dw, (size_t) sh.N * sh.K, dx, x_ne1, dy, dids, n_used, T, sh.N, sh.K };

        // the reference: every 7th row (all of them below 4096 rows), each pair, double sums
        const int          row_step = sh.N > 4096 ? 7 : 1;
        std::vector<double> ref((size_t) pairs * sh.N);
        std::vector<double> xr(sh.K);
        for (int p = 0; p < pairs; ++p) {
            const int     e  = moe ? ids[p] : 0;
            const float * xp = x.data() + ((size_t) (p / n_used) * x_ne1 + (p % n_used) % x_ne1) * sh.K;
            for (int k = 0; k < sh.K; ++k) {
                xr[k] = __half2float(__float2half(xp[k]));  // rounded as the kernels round it
            }
            for (int n = 0; n < sh.N; n += row_step) {
                const __half * wr = w.data() + ((size_t) e * sh.N + n) * sh.K;
                double         s  = 0.0;
                for (int k = 0; k < sh.K; ++k) {
                    s += (double) __half2float(wr[k]) * xr[k];
                }
                ref[(size_t) p * sh.N + n] = s;
            }
        }
        std::vector<float> row;
        const form lf = library_form(a, grid_y, prop.multiProcessorCount);
        const form rf = proposed_form(a, grid_y, prop.multiProcessorCount);
        std::printf("\n%s: %d copies, %.1f MB a launch; L is W %d RG %d, R is W %d RG %d S %d\n", sh.name, copies,
                    read / 1e6, lf.W, lf.RG, rf.W, rf.RG, rf.S);
        // every variant checked before any is timed; a failed check ends the study
        for (const variant & v : VARIANTS) {
            const form f = form_of(v, a, grid_y, prop.multiProcessorCount);
            if (!runs(f, a)) {
                continue;
            }
            CHECK_CUDA(cudaMemset(dy, 0xff, (size_t) pairs * sh.N * 4));  // NaNs: a missed row fails
            launch(f, a, grid_y, stream);
            CHECK_CUDA(cudaStreamSynchronize(stream));
            std::vector<float> y((size_t) pairs * sh.N);
            CHECK_CUDA(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
            // f32 sums of K products of magnitude <= 1 (|y| ~ sqrt(K) / 3): 4e-6 K is ~1e-4 of |y|
            // at K 2560, where a wrong row or column is off by ~|y|
            const double bound = 4e-6 * sh.K;
            double       worst = 0.0;
            for (int p = 0; p < pairs; ++p) {
                for (int n = 0; n < sh.N; n += row_step) {
                    const double err = std::fabs(y[(size_t) p * sh.N + n] - ref[(size_t) p * sh.N + n]) / bound;
                    worst            = std::isnan(err) ? INFINITY : std::max(worst, err);
                }
            }
            std::printf("  %-5s check %s (worst error %.3f of the bound)\n", v.name, worst <= 1.0 ? "ok" : "FAILED",
                        worst);
            if (!(worst <= 1.0)) {
                std::printf("CHECKS FAILED\n");
                return 1;
            }
        }
        for (const variant & v : VARIANTS) {
            const form f = form_of(v, a, grid_y, prop.multiProcessorCount);
            if (!runs(f, a)) {
                std::printf("  %-5s does not divide K\n", v.name);
                row.push_back(NAN);
                continue;
            }
            cudaGraph_t     graph;
            cudaGraphExec_t exec;
            CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            for (int c = 0; c < copies; ++c) {
                args ac = a;
                ac.w    = dw + one * c;
                launch(f, ac, grid_y, stream);
            }
            CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
            CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
            CHECK_CUDA(cudaGraphLaunch(exec, stream));
            CHECK_CUDA(cudaStreamSynchronize(stream));
            cudaEvent_t e0, e1;
            CHECK_CUDA(cudaEventCreate(&e0));
            CHECK_CUDA(cudaEventCreate(&e1));
            std::vector<float> us;
            for (int r = 0; r < 20; ++r) {
                CHECK_CUDA(cudaEventRecord(e0, stream));
                CHECK_CUDA(cudaGraphLaunch(exec, stream));
                CHECK_CUDA(cudaEventRecord(e1, stream));
                CHECK_CUDA(cudaEventSynchronize(e1));
                float ms;
                CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                us.push_back(1e3f * ms / copies);
            }
            std::sort(us.begin(), us.end());
            const float med = us[us.size() / 2];
            std::printf("  %-5s %8.2f us (%.2f-%.2f)  %6.0f GB/s\n", v.name, med, us.front(), us.back(),
                        read / (med * 1e3));
            row.push_back(med);
            CHECK_CUDA(cudaEventDestroy(e0));
            CHECK_CUDA(cudaEventDestroy(e1));
            CHECK_CUDA(cudaGraphExecDestroy(exec));
            CHECK_CUDA(cudaGraphDestroy(graph));
        }
        table.push_back(row);
        CHECK_CUDA(cudaFree(dw));
        CHECK_CUDA(cudaFree(dx));
        CHECK_CUDA(cudaFree(dy));
        if (dids) {
            CHECK_CUDA(cudaFree(dids));
        }
    }
    std::printf("\n| shape |");
    for (const variant & v : VARIANTS) {
        std::printf(" %s |", v.name);
    }
    std::printf("\n| --- |");
    for (size_t i = 0; i < sizeof(VARIANTS) / sizeof(VARIANTS[0]); ++i) {
        std::printf(" --- |");
    }
    for (size_t s = 0; s < table.size(); ++s) {
        std::printf("\n| %s |", SHAPES[s].name);
        for (float v : table[s]) {
            if (std::isnan(v)) {
                std::printf(" - |");
            } else {
                std::printf(" %.2f |", v);
            }
        }
    }
    std::printf("\nall checks passed\n");
    return 0;
}
