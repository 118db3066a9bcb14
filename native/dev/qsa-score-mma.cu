// Dev corner (see README.md here): a prefill chunk's QSA block scores on tensor cores, against the
// library's path, before anything moves into native/ggml.
//
//   score[t, b] = scale * sum over h of ReLU(q[t, h] . k[b])      q: [n_tps, NH, D], k: [n_blocks, D]
//
// The library computes it as an f32 matrix product (cuBLAS, f32 FMAs: 3.8 ms a layer for 2048
// queries x 65536 blocks on the H200, session 11) and QSA_SCORE_SUM over its [n_blocks, NH, n_tps]
// result (0.6 ms more). Variant 1 is that path. Variant 2 fuses both on tensor cores: q and k each
// split into f16 hi + lo (x = hi + lo to about 2^-22 relative), S = qh kh + qh kl + ql kh (ql kl,
// ~2^-22 of a term, dropped) with f32 accumulators, and the ReLU, the head sum (heads added in
// order) and the scale in the epilogue, so the [n_blocks, NH, n_tps] product never reaches memory.
//
// A CTA takes 16 queries (all NH heads: m-tile h is head h, rows are the queries) and walks tiles
// of TB blocks; each of its 4 warps owns 32 blocks of a tile (4 n-tiles of 8). So a thread holds
// all NH heads of the same (query, block) entries and sums them without a shuffle.
//
// Checks (each run, before timing): both variants against a double-precision reference (nmse,
// max error over the row's largest score), and the top-k selection each gives (k = 512, ties to
// the lower index, as qsa_topk) against the reference's; a selection that differs is reported
// with the score gap at its cut, relative to the cut's score: a near-tie (~1e-6) is rounding.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda native/dev/qsa-score-mma.cu -lcublas \
//        -o /tmp/qsa-score-mma && /tmp/qsa-score-mma
#include "mma-ptx.cuh"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace pyqsa_mma;

#define CHECK_CUDA(x)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));       \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

namespace {

constexpr int D       = 128;  // Flash-Next's indexer head dim
constexpr int NH      = 4;    // indexer heads
constexpr int TQ      = 16;   // queries of a CTA: the M of each head's m-tile
constexpr int WARPS   = 4;
constexpr int NT      = 4;                 // n-tiles of 8 blocks per warp
constexpr int TB      = WARPS * NT * 8;    // blocks of a tile: 128
constexpr int THREADS = WARPS * 32;

// chunk c of row r of a [rows][D] half matrix lives at c ^ (r % 8): ldmatrix's 8 rows of one
// chunk fall in 8 bank groups
__device__ __forceinline__ int swz(int r, int chunk) {
    return r * D + ((chunk ^ (r & 7)) << 3);
}

constexpr size_t Q_HALVES   = (size_t) NH * TQ * D;  // per hi / lo
constexpr size_t K_HALVES   = (size_t) TB * D;
constexpr size_t SMEM_BYTES = 2 * (Q_HALVES + K_HALVES) * sizeof(half);

__device__ __forceinline__ void split4(const float4 x, half * hi, half * lo) {
    const float v[4] = { x.x, x.y, x.z, x.w };
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const half h = __float2half_rn(v[i]);
        hi[i]        = h;
        lo[i]        = __float2half_rn(v[i] - __half2float(h));
    }
}

// grid (tiles over the blocks, ceil(n_tps / TQ)); a CTA walks block tiles blockIdx.x, + gridDim.x, ...
__global__ void __launch_bounds__(THREADS) score_mma(const float * q, const float * k, float * out, int n_tps,
                                                     int n_blocks, float scale) {
    extern __shared__ __align__(16) char smem[];
    half * q_hi = (half *) smem;
    half * q_lo = q_hi + Q_HALVES;
    half * k_hi = q_lo + Q_HALVES;
    half * k_lo = k_hi + K_HALVES;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t4 = lane % 4;
    const int t0 = blockIdx.y * TQ;

    // the CTA's queries, head h's rows at q_hi + h * TQ * D; rows past n_tps zero
    for (int i = tid; i < NH * TQ * (D / 4); i += THREADS) {
        const int    f4 = i % (D / 4), r = (i / (D / 4)) % TQ, h = i / (D / 4) / TQ;
        const float4 x  = t0 + r < n_tps ? ((const float4 *) (q + ((size_t) (t0 + r) * NH + h) * D))[f4]
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const int    o  = h * TQ * D + swz(r, f4 / 2) + (f4 % 2) * 4;
        split4(x, q_hi + o, q_lo + o);
    }

    for (int b0 = blockIdx.x * TB; b0 < n_blocks; b0 += gridDim.x * TB) {
        __syncthreads();  // the last tile's reads are done (and the queries are in, the first time)
        for (int i = tid; i < TB * (D / 4); i += THREADS) {
            const int    f4 = i % (D / 4), r = i / (D / 4);
            const float4 x  = b0 + r < n_blocks ? ((const float4 *) (k + (size_t) (b0 + r) * D))[f4]
                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const int    o  = swz(r, f4 / 2) + (f4 % 2) * 4;
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
                ldmatrix_x4(bh[j], k_hi + swz(r, kk * 4 + lane / 8));
                ldmatrix_x4(bl[j], k_lo + swz(r, kk * 4 + lane / 8));
            }
#pragma unroll
            for (int s = 0; s < 2; ++s) {
#pragma unroll
                for (int h = 0; h < NH; ++h) {
                    uint32_t  ah[4], al[4];
                    const int ch = (kk * 2 + s) * 2 + lane / 16;
                    ldmatrix_x4(ah, q_hi + h * TQ * D + swz(lane % 16, ch));
                    ldmatrix_x4(al, q_lo + h * TQ * D + swz(lane % 16, ch));
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        mma_f16(acc[h][j], ah, bh[j][2 * s], bh[j][2 * s + 1]);
                        mma_f16(acc[h][j], ah, bl[j][2 * s], bl[j][2 * s + 1]);
                        mma_f16(acc[h][j], al, bh[j][2 * s], bh[j][2 * s + 1]);
                    }
                }
            }
        }

        // rows g and g + 8 (queries), columns 2 t4 and 2 t4 + 1 of each n-tile (blocks)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int b = b0 + warp * NT * 8 + j * 8 + 2 * t4;
#pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                const int t = t0 + g + 8 * half_row;
                if (t >= n_tps) {
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
                    v[c] = sum * scale;
                }
                float * o = out + (size_t) t * n_blocks + b;
                if (n_blocks % 2 == 0 && b + 1 < n_blocks) {  // even rows keep b even: 8-byte aligned
                    *(float2 *) o = make_float2(v[0], v[1]);
                } else {
                    for (int c = 0; c < 2 && b + c < n_blocks; ++c) {
                        o[c] = v[c];
                    }
                }
            }
        }
    }
}

// variant 1's second half, as QSA_SCORE_SUM: prod [n_tps][NH][n_blocks] -> out [n_tps][n_blocks]
__global__ void relu_head_sum(const float * prod, float * out, int n_tps, int n_blocks, float scale) {
    const size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t) n_tps * n_blocks) {
        return;
    }
    const size_t t = i / n_blocks, b = i % n_blocks;
    float        sum = 0.0f;
    for (int h = 0; h < NH; ++h) {
        sum += fmaxf(prod[(t * NH + h) * n_blocks + b], 0.0f);
    }
    out[i] = sum * scale;
}

struct problem {
    int                n_tps, n_blocks;
    std::vector<float> q, k;
};

problem make_problem(int n_tps, int n_blocks, std::mt19937 & rng) {
    // normed, roped keys and queries are O(1): normal(0, 1)
    std::normal_distribution<float> nd(0.0f, 1.0f);
    problem p{ n_tps, n_blocks, std::vector<float>((size_t) n_tps * NH * D), std::vector<float>((size_t) n_blocks * D) };
    for (auto & x : p.q) x = nd(rng);
    for (auto & x : p.k) x = nd(rng);
    return p;
}

std::vector<double> reference(const problem & p, double scale) {
    std::vector<double> s((size_t) p.n_tps * p.n_blocks);
    for (int t = 0; t < p.n_tps; ++t) {
        for (int b = 0; b < p.n_blocks; ++b) {
            double sum = 0.0;
            for (int h = 0; h < NH; ++h) {
                const float * qr  = &p.q[((size_t) t * NH + h) * D];
                const float * kr  = &p.k[(size_t) b * D];
                double        dot = 0.0;
                for (int d = 0; d < D; ++d) dot += (double) qr[d] * kr[d];
                sum += std::max(dot, 0.0);
            }
            s[(size_t) t * p.n_blocks + b] = sum * scale;
        }
    }
    return s;
}

// the top k of a row, ties to the lower index, as a sorted index list
template <typename T> std::vector<int> topk(const T * row, int n, int k) {
    std::vector<int> idx(n);
    for (int i = 0; i < n; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [row](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
}

struct gpu_problem {
    float *        q = nullptr, *k = nullptr, *prod = nullptr, *out = nullptr;
    int            n_tps, n_blocks;
    cublasHandle_t blas;

    explicit gpu_problem(const problem & p, cublasHandle_t h) : n_tps(p.n_tps), n_blocks(p.n_blocks), blas(h) {
        CHECK_CUDA(cudaMalloc(&q, p.q.size() * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&k, p.k.size() * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&prod, (size_t) n_tps * NH * n_blocks * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&out, (size_t) n_tps * n_blocks * sizeof(float)));
        CHECK_CUDA(cudaMemcpy(q, p.q.data(), p.q.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(k, p.k.data(), p.k.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    ~gpu_problem() {
        cudaFree(q);
        cudaFree(k);
        cudaFree(prod);
        cudaFree(out);
    }

    // variant 1: the f32 product [n_tps * NH][n_blocks] (column-major n_blocks x n_tps*NH) and the sum
    void run_v1(float scale) {
        const float one = 1.0f, zero = 0.0f;
        if (cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, n_blocks, n_tps * NH, D, &one, k, D, q, D, &zero, prod,
                        n_blocks) != CUBLAS_STATUS_SUCCESS) {
            std::fprintf(stderr, "cublasSgemm failed\n");
            std::exit(1);
        }
        const size_t n = (size_t) n_tps * n_blocks;
        relu_head_sum<<<(unsigned) ((n + 255) / 256), 256>>>(prod, out, n_tps, n_blocks, scale);
        CHECK_CUDA(cudaGetLastError());
    }

    // variant 2: fused on tensor cores; `ctas` CTAs along the blocks (0: one per tile)
    void run_v2(float scale, int ctas) {
        const int tiles = (n_blocks + TB - 1) / TB;
        const dim3 grid(ctas > 0 ? std::min(ctas, tiles) : tiles, (n_tps + TQ - 1) / TQ);
        score_mma<<<grid, THREADS, SMEM_BYTES>>>(q, k, out, n_tps, n_blocks, scale);
        CHECK_CUDA(cudaGetLastError());
    }

    std::vector<float> result() const {
        std::vector<float> r((size_t) n_tps * n_blocks);
        CHECK_CUDA(cudaMemcpy(r.data(), out, r.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return r;
    }
};

template <typename F> double time_us(F && f, int iters) {
    f();
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    CHECK_CUDA(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1e3 * ms / iters;
}

// one variant's result against the reference: nmse, max error over the row's largest score, and
// the rows whose top-k differs with the worst relative gap at the cut
bool check(const char * name, const problem & p, const std::vector<double> & ref, const std::vector<float> & got) {
    constexpr int K   = 512;
    double        err = 0.0, norm = 0.0, max_rel = 0.0, worst_gap = 0.0;
    int           rows_differ = 0;
    for (int t = 0; t < p.n_tps; ++t) {
        const double * r = &ref[(size_t) t * p.n_blocks];
        const float *  o = &got[(size_t) t * p.n_blocks];
        double         row_max = 0.0;
        for (int b = 0; b < p.n_blocks; ++b) {
            const double d = o[b] - r[b];
            err += d * d;
            norm += r[b] * r[b];
            row_max = std::max(row_max, std::fabs(r[b]));
        }
        for (int b = 0; b < p.n_blocks; ++b) max_rel = std::max(max_rel, std::fabs(o[b] - r[b]) / std::max(row_max, 1e-30));
        if (p.n_blocks <= K) continue;
        const std::vector<int> sr = topk(r, p.n_blocks, K), so = topk(o, p.n_blocks, K);
        if (sr != so) {
            ++rows_differ;
            // the reference's scores of the cut: the K-th largest and the next one
            std::vector<double> sorted(r, r + p.n_blocks);
            std::nth_element(sorted.begin(), sorted.begin() + K, sorted.end(), std::greater<double>());
            const double next = sorted[K];
            const double kth  = *std::min_element(sorted.begin(), sorted.begin() + K);
            worst_gap = std::max(worst_gap, (kth - next) / std::max(std::fabs(kth), 1e-30));
        }
    }
    const double nm = norm > 0.0 ? err / norm : err;
    const bool   ok = nm < 1e-11 && max_rel < 1e-5 && (rows_differ == 0 || worst_gap < 1e-5);
    std::printf("  %-30s n_tps=%d n_blocks=%d: nmse %.3e, max err / row max %.3e, top-%d differs in %d of %d rows"
                " (largest cut gap %.2e of the cut's score): %s\n",
                name, p.n_tps, p.n_blocks, nm, max_rel, K, rows_differ, p.n_tps, worst_gap, ok ? "OK" : "FAIL");
    return ok;
}

}  // namespace

int main() {
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH);  // f32 FMAs, as the library's GGML_PREC_F32 product
    CHECK_CUDA(cudaFuncSetAttribute(score_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) SMEM_BYTES));
    std::mt19937 rng(42);
    const float  scale = 1.0f / std::sqrt((float) D);

    // correctness: a tail of queries and blocks past the tiles, and a long row
    std::printf("checks against a double-precision reference:\n");
    bool ok = true;
    for (const auto [n_tps, n_blocks] : { std::pair{ 37, 1000 }, std::pair{ 16, 65536 }, std::pair{ 300, 4099 } }) {
        const problem       p = make_problem(n_tps, n_blocks, rng);
        const auto          ref = reference(p, scale);
        gpu_problem         g(p, blas);
        g.run_v1(scale);
        ok &= check("v1 cuBLAS f32 + relu-sum", p, ref, g.result());
        g.run_v2(scale, 0);
        ok &= check("v2 tensor cores, hi/lo f16", p, ref, g.result());
        g.run_v2(scale, 3);  // CTAs walking several tiles
        ok &= check("v2, 3 CTAs along the blocks", p, ref, g.result());
    }

    // timings: a 512- and a 2048-query chunk at 256K (65536 blocks), 2048 queries at 32K
    std::printf("timings (us a call, median of 5 runs of 20 calls):\n");
    for (const auto [n_tps, n_blocks] : { std::pair{ 512, 65536 }, std::pair{ 2048, 65536 }, std::pair{ 2048, 8192 } }) {
        const problem p = make_problem(n_tps, n_blocks, rng);
        gpu_problem   g(p, blas);
        const double  flop = 2.0 * n_tps * NH * (double) n_blocks * D;
        for (int v = 1; v <= 2; ++v) {
            std::vector<double> runs;
            for (int r = 0; r < 5; ++r) {
                runs.push_back(v == 1 ? time_us([&] { g.run_v1(scale); }, 20) : time_us([&] { g.run_v2(scale, 0); }, 20));
            }
            std::sort(runs.begin(), runs.end());
            std::printf("  v%d n_tps=%d n_blocks=%d: %.1f us (%.1f-%.1f), %.1f TFLOP/s of f32-equivalent products\n", v,
                        n_tps, n_blocks, runs[2], runs[0], runs[4], flop / runs[2] / 1e6);
        }
    }
    cublasDestroy(blas);
    std::printf("%s\n", ok ? "all checks passed" : "CHECKS FAILED");
    return ok ? 0 : 1;
}
