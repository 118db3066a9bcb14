// Study: one-column q8_0 products (a one-sequence decode step of a quantized file: the linear
// attention's q8_0 products, the largest kernel of the Q4_K_M step, gemv_one<q8_0> at ~1.7 TB/s on
// one H100). q8_0 blocks are 34 bytes (f16 d, 32 int8 quants), so the library reads a chunk of 8
// quants as four 2-byte loads and d as a fifth. Forms, each a warp of R = 4 rows (the library's
// gemv_one<q8_0, 4, 1>), weights dequantized to f16 as the library does (q exact, one f16 product
// by d), sums in f32:
//   A   the library's: lane-step s, chunk s of each row, 2-byte streaming loads
//   W3  the same chunks, the 8 quant bytes from 3 aligned 4-byte loads and a funnel shift
//   B4  lane-step s takes block s whole (32 weights): its 34 bytes from 9 aligned 4-byte loads
//       (cached: consecutive lanes' blocks share sectors), d and the quants by funnel shifts
// Checked against a double reference over the same f16 weights first; timed as the median of 20
// CUDA graphs of 16 launches, each on another copy of the weights (copies past 4x the L2).
#include "cuda-check.cuh"
#include "graph-timing.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int WARP  = 32;
constexpr int WARPS = 8;
constexpr int R     = 4;   // rows a warp
constexpr int QK    = 32;  // weights a block
constexpr int BLOCK_BYTES = 34;

struct args {
    const uint8_t * w;  // [N rows of K / 32 blocks], rows of row_bytes
    const float *   x;  // [K]
    float *         y;  // [N]
    int             N, K;
    size_t          row_bytes;
};

__device__ __forceinline__ uint32_t ld16cs(const uint8_t * p) {
    return __ldcs((const unsigned short *) p);
}

// the 4 signed bytes of v, bytes `hi` ? 2, 3 : 0, 1, as half2 (q0 d, q1 d): q + 128 biased into
// 1024 + 128 + q by the f16 of 0x64 over the byte, less 1152
__device__ __forceinline__ half2 pair(uint32_t v, bool hi, half2 d) {
    const uint32_t h = __byte_perm(v ^ 0x80808080u, 0x64646464u, hi ? 0x4342 : 0x4140);
    return __hmul2(__hsub2(*(const half2 *) &h, __float2half2_rn(1152.0f)), d);
}

__device__ __forceinline__ half2 splat(uint32_t bits16) {
    const uint32_t b = bits16 | bits16 << 16;
    return *(const half2 *) &b;
}

// acc += the 8 weights of q (two words of quants) at scale d times x[0..7]
__device__ __forceinline__ float dot8(uint32_t q0, uint32_t q1, half2 d, const float * x, float acc) {
    const float4 x0 = __ldg((const float4 *) x), x1 = __ldg((const float4 *) x + 1);
    const float2 a = __half22float2(pair(q0, false, d)), b = __half22float2(pair(q0, true, d));
    const float2 c = __half22float2(pair(q1, false, d)), e = __half22float2(pair(q1, true, d));
    acc = fmaf(a.x, x0.x, acc);
    acc = fmaf(a.y, x0.y, acc);
    acc = fmaf(b.x, x0.z, acc);
    acc = fmaf(b.y, x0.w, acc);
    acc = fmaf(c.x, x1.x, acc);
    acc = fmaf(c.y, x1.y, acc);
    acc = fmaf(e.x, x1.z, acc);
    acc = fmaf(e.y, x1.w, acc);
    return acc;
}

__device__ __forceinline__ void store(const args & a, int row0, float (&acc)[R], int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (row0 + r < a.N) {
                a.y[row0 + r] = acc[r];
            }
        }
    }
}

// the warp's R rows from row0 (rows past N read row N - 1 again, never stored)
__device__ __forceinline__ void warp_rows(const args & a, int row0, const uint8_t * (&rows)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        rows[r] = a.w + (size_t) min(row0 + r, a.N - 1) * a.row_bytes;
    }
}

// A and W3: chunk s of every row a lane-step
template <bool WORDS> __global__ void __launch_bounds__(WARPS * WARP) gemv_chunks(const args a) {
    const int lane = threadIdx.x % WARP;
    const int row0 = (blockIdx.x * WARPS + threadIdx.x / WARP) * R;
    if (row0 >= a.N) {
        return;
    }
    const uint8_t * rows[R];
    warp_rows(a, row0, rows);
    float     acc[R]   = {};
    const int n_chunks = a.K / 8;
#pragma unroll 4
    for (int s = lane; s < n_chunks; s += WARP) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t * b = rows[r] + (size_t) (s / 4) * BLOCK_BYTES;
            const uint8_t * q = b + 2 + (s % 4) * 8;
            uint32_t        q0, q1;
            if constexpr (WORDS) {
                const uint32_t * w  = (const uint32_t *) ((uintptr_t) q & ~(uintptr_t) 3);
                const int        sh = (int) ((uintptr_t) q & 3) * 8;  // 0 or 16
                const uint32_t   w0 = __ldcs(w), w1 = __ldcs(w + 1), w2 = __ldcs(w + 2);
                q0                  = __funnelshift_r(w0, w1, sh);
                q1                  = __funnelshift_r(w1, w2, sh);
            } else {
                q0 = ld16cs(q) | ld16cs(q + 2) << 16;
                q1 = ld16cs(q + 4) | ld16cs(q + 6) << 16;
            }
            acc[r] = dot8(q0, q1, splat(ld16cs(b)), a.x + s * 8, acc[r]);
        }
    }
    store(a, row0, acc, lane);
}

// B4: block s of every row a lane-step, its bytes from the 9 aligned words that hold them (the
// weights' buffer has 4 bytes past its end for the last block's window)
__global__ void __launch_bounds__(WARPS * WARP) gemv_blocks(const args a) {
    const int lane = threadIdx.x % WARP;
    const int row0 = (blockIdx.x * WARPS + threadIdx.x / WARP) * R;
    if (row0 >= a.N) {
        return;
    }
    const uint8_t * rows[R];
    warp_rows(a, row0, rows);
    float     acc[R]   = {};
    const int n_blocks = a.K / QK;
#pragma unroll 2
    for (int s = lane; s < n_blocks; s += WARP) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t *  b   = rows[r] + (size_t) s * BLOCK_BYTES;
            const uint32_t * w   = (const uint32_t *) ((uintptr_t) b & ~(uintptr_t) 3);
            const int        off = (int) ((uintptr_t) b & 3);  // 0 or 2
            uint32_t         v[9];
#pragma unroll
            for (int i = 0; i < 9; ++i) {
                v[i] = __ldg(w + i);
            }
            const half2 d = splat(__funnelshift_r(v[0], v[1], 8 * off) & 0xffffu);
            // quants from byte off + 2: a shift of 16 or 32 bits (the clamped shift gives v[i + 1] at 32)
            const int qs = 8 * off + 16;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const uint32_t q0 = __funnelshift_rc(v[2 * c], v[2 * c + 1], qs);
                const uint32_t q1 = __funnelshift_rc(v[2 * c + 1], v[2 * c + 2], qs);
                acc[r]            = dot8(q0, q1, d, a.x + s * QK + c * 8, acc[r]);
            }
        }
    }
    store(a, row0, acc, lane);
}

enum form { FORM_A, FORM_W3, FORM_B4, N_FORMS };
const char * form_name[N_FORMS] = { "A", "W3", "B4" };

void launch(form f, const args & a, cudaStream_t st) {
    const dim3 grid((a.N + WARPS * R - 1) / (WARPS * R));
    switch (f) {
        case FORM_A:  gemv_chunks<false><<<grid, WARPS * WARP, 0, st>>>(a); break;
        case FORM_W3: gemv_chunks<true><<<grid, WARPS * WARP, 0, st>>>(a); break;
        case FORM_B4: gemv_blocks<<<grid, WARPS * WARP, 0, st>>>(a); break;
        default: break;
    }
}

struct shape {
    const char * what;
    int          N, K;
};

}  // namespace

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("gemv-q8-one: %s, %d SMs, L2 %d MB; q8_0 weights, one f32 column, %d rows a warp\n", prop.name,
                prop.multiProcessorCount, prop.l2CacheSize >> 20, R);
    const shape shapes[] = {
        { "linear attention in-proj", 12288, 2560 },
        { "linear attention out", 2560, 4096 },
        { "QSA out", 2560, 6144 },
        { "shared expert gate+up", 1024, 2560 },
    };
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    bool all_ok = true;
    for (const shape & sh : shapes) {
        const size_t row_bytes = (size_t) sh.K / QK * BLOCK_BYTES;
        const size_t bytes     = row_bytes * sh.N;
        const size_t span      = (bytes + 4 + 255) / 256 * 256;  // a copy and the last window's spare bytes
        const int    copies    = (int) std::max<size_t>(2, 4 * (size_t) prop.l2CacheSize / bytes + 1);
        std::mt19937 rng(77 + sh.N + sh.K);
        std::uniform_int_distribution<int> qd(-127, 127);
        std::uniform_real_distribution<float> dd(0.001f, 0.01f);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<uint8_t> w(span, 0);
        std::vector<double>  ref(sh.N, 0.0);
        std::vector<float>   x(sh.K);
        for (float & v : x) v = nd(rng);
        for (int n = 0; n < sh.N; ++n) {
            for (int b = 0; b < sh.K / QK; ++b) {
                uint8_t *    blk = &w[(size_t) n * row_bytes + (size_t) b * BLOCK_BYTES];
                const __half d   = __float2half(dd(rng));
                std::memcpy(blk, &d, 2);
                for (int j = 0; j < QK; ++j) {
                    const int8_t q = (int8_t) qd(rng);
                    std::memcpy(blk + 2 + j, &q, 1);
                    // the weight as the kernels make it: q d rounded to f16 once
                    const float wf = __half2float(__float2half((float) q * __half2float(d)));
                    ref[n] += (double) wf * x[b * QK + j];
                }
            }
        }
        double mag = 0.0;
        for (double r : ref) mag = std::max(mag, std::fabs(r));
        uint8_t * w_d;
        float *   x_d, *y_d;
        CHECK_CUDA(cudaMalloc(&w_d, span * copies));
        CHECK_CUDA(cudaMalloc(&x_d, x.size() * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&y_d, sh.N * sizeof(float)));
        for (int c = 0; c < copies; ++c) {
            CHECK_CUDA(cudaMemcpy(w_d + c * span, w.data(), span, cudaMemcpyHostToDevice));
        }
        CHECK_CUDA(cudaMemcpy(x_d, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        std::printf("\n%s, %d x %d (%.1f MB of weights a launch, %d copies)\n", sh.what, sh.N, sh.K, bytes / 1e6,
                    copies);
        for (int f = 0; f < N_FORMS; ++f) {
            const args a = { w_d, x_d, y_d, sh.N, sh.K, row_bytes };
            CHECK_CUDA(cudaMemset(y_d, 0xff, sh.N * sizeof(float)));
            launch((form) f, a, st);
            CHECK_CUDA(cudaGetLastError());
            CHECK_CUDA(cudaStreamSynchronize(st));
            std::vector<float> y(sh.N);
            CHECK_CUDA(cudaMemcpy(y.data(), y_d, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
            double err = 0.0;
            for (int n = 0; n < sh.N; ++n) {
                err = std::max(err, std::fabs(y[n] - ref[n]) / mag);
            }
            const bool ok = err < 1e-5;
            all_ok        = all_ok && ok;
            std::printf("  %-3s max |err| / max |y| %.2e: %s", form_name[f], err, ok ? "OK" : "FAIL\n");
            if (!ok) {
                continue;  // a failed form is not timed
            }
            // 16 launches a graph, each on the next copy
            const launch_times t = time_launches(st, 16, [&](int i) {
                const args ai = { w_d + (size_t) (i % copies) * span, x_d, y_d, sh.N, sh.K, row_bytes };
                launch((form) f, ai, st);
            });
            std::printf("; %8.2f us a launch (%.2f-%.2f), %.0f GB/s\n", t.median, t.min, t.max,
                        bytes / (t.median * 1e3));
        }
        CHECK_CUDA(cudaFree(w_d));
        CHECK_CUDA(cudaFree(x_d));
        CHECK_CUDA(cudaFree(y_d));
    }
    std::printf("\n%s\n", all_ok ? "all forms passed" : "a form FAILED");
    return all_ok ? 0 : 1;
}
