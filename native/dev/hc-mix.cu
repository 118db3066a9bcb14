// Dev corner (see README.md here): the hyper-connection mix of Flash-Next's layers at decode
// shapes (1 and 8 tokens), as the library runs it today against two fused launches, before a fused
// op moves into native/ggml.
//
// Each layer mixes its HC = 4 residual streams twice (before attention and before the FFN), 96
// mixes a step of the 48-layer model. One mix, x [E, HC, T] (E = 2560), weights f16:
//   xn[e, s, t]  = x[e, s, t] / sqrt(mean_e x[., s, t]^2 + eps) * w_norm[e, s]
//   lo[r, t]     = silu(sum_k down[r, k] xn[k, t] / HC)            r < R = 320, k < D = HC E
//   inject[c, t] = sum_k inj[c, k] xn[k, t]                          c < HC
//   gate[k, t]   = sum_r up[k, r] lo[r, t]
//   mixed[e, t]  = sum_s xn[e, s, t] sigmoid(gate[e + s E, t]) / HC
// Variant A has the launches of the library's decode chain, one a step of it, in plain kernels
// of this file: the norm with its multiply (upstream's fused rms_norm), down and inject in one
// launch (pyqsa's grouped gemv), silu_scaled, up, hc_pre_gated: five launches. Variant B is two: (1) every CTA computes
// the HC x T norm scales itself, then the down and inject rows on xn made on the fly, silu_scaled
// in the epilogue; (2) up, a warp a column e with 8 lanes a stream, the gate, the sigmoid and the
// mean over the streams in the epilogue. The question for the step: what five launches cost
// against two in a CUDA graph of 96 mixes, against the 13.2 MB of weights a mix reads. Sums are
// reassociated in B, so both are checked against a double-precision reference.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda native/dev/hc-mix.cu -o /tmp/hc-mix && /tmp/hc-mix
#include "cuda-check.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int   E     = 2560;
constexpr int   HC    = 4;
constexpr int   D     = E * HC;
constexpr int   R     = 320;
constexpr int   MIXES = 96;  // a step of the 48-layer model
constexpr float EPS   = 1e-6f;
constexpr int   WARPS = 8;
constexpr int   CHUNK = 8;  // halves a lane loads at once: 16 bytes

// one mix's tensors on the device
struct mix_buffers {
    const float *  w_norm;  // [D]
    const __half * down;    // [R][D]
    const __half * inj;     // [HC][D]
    const __half * up;      // [D][R]
    float *        xn;      // [T][D] (A)
    float *        lo;      // [T][R]
    float *        inject;  // [T][HC]
    float *        gate;    // [T][D] (A)
    float *        scale;   // [T][HC] (B)
    float *        mixed;   // [T][E]
};

__device__ __forceinline__ float warp_sum(float v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) {
        v += __shfl_xor_sync(0xffffffff, v, o);
    }
    return v;
}

__device__ __forceinline__ void load_chunk(const __half * p, float (&f)[CHUNK]) {
    const uint4     v = __ldcs((const uint4 *) p);
    const __half2 * h = (const __half2 *) &v;
#pragma unroll
    for (int i = 0; i < CHUNK / 2; ++i) {
        const float2 g = __half22float2(h[i]);
        f[2 * i]       = g.x;
        f[2 * i + 1]   = g.y;
    }
}

// ---- A: the library's chain ----

// grid (HC, T): xn = x * rsqrt(mean x^2 + eps) * w_norm over one stream of one token
__global__ void a_norm(const float * x, mix_buffers m) {
    const int     s = blockIdx.x, t = blockIdx.y;
    const float * xs = x + (size_t) t * D + s * E;
    float         ss = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        ss += xs[e] * xs[e];
    }
    __shared__ float part[32];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) {
        part[threadIdx.x / 32] = ss;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = warp_sum(threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f);
        if (threadIdx.x == 0) {
            part[0] = ss;
        }
    }
    __syncthreads();
    const float sc = rsqrtf(part[0] / E + EPS);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        m.xn[(size_t) t * D + s * E + e] = xs[e] * sc * m.w_norm[s * E + e];
    }
}

// LPR lanes a row, each lane's chunks in order: y[t][row] = w[row] . x[t] for T tokens, rows of
// two matrices (w0 then w1) in one grid, as the grouped gemv launches down and inject
template <int T, int LPR>
__global__ void __launch_bounds__(WARPS * 32)
    a_gemv(const __half * w0, int n0, float * y0, const __half * w1, int n1, float * y1, const float * x, int K) {
    const int lane = threadIdx.x % LPR;
    const int row  = (blockIdx.x * WARPS * 32 + threadIdx.x) / LPR;
    if (row >= n0 + n1) {
        return;
    }
    const __half * w = row < n0 ? w0 + (size_t) row * K : w1 + (size_t) (row - n0) * K;
    float          acc[T] = {};
    for (int c = lane; c < K / CHUNK; c += LPR) {
        float f[CHUNK];
        load_chunk(w + c * CHUNK, f);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float4 x0 = *(const float4 *) (x + (size_t) t * K + c * CHUNK);
            const float4 x1 = *((const float4 *) (x + (size_t) t * K + c * CHUNK) + 1);
            acc[t] += f[0] * x0.x + f[1] * x0.y + f[2] * x0.z + f[3] * x0.w + f[4] * x1.x + f[5] * x1.y +
                      f[6] * x1.z + f[7] * x1.w;
        }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        acc[t] = warp_sum(acc[t], LPR);
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (row < n0) {
                y0[(size_t) t * n0 + row] = acc[t];
            } else {
                y1[(size_t) t * n1 + row - n0] = acc[t];
            }
        }
    }
}

__global__ void a_silu_scaled(float * lo, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = lo[i] / HC;
        lo[i]         = v / (1.0f + expf(-v));
    }
}

// grid over (e, t): the gated mean over the streams
__global__ void a_hc_pre(mix_buffers m, int T) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= E * T) {
        return;
    }
    const int e = i % E, t = i / E;
    float     sum = 0.0f;
#pragma unroll
    for (int s = 0; s < HC; ++s) {
        const size_t k = (size_t) t * D + s * E + e;
        sum += m.xn[k] / (1.0f + expf(-m.gate[k]));
    }
    m.mixed[(size_t) t * E + e] = sum / HC;
}

template <int T> void run_a(const float * x, const mix_buffers & m, cudaStream_t st) {
    a_norm<<<dim3(HC, T), 256, 0, st>>>(x, m);
    const int rows_down = R + HC;
    a_gemv<T, 32><<<(rows_down + WARPS - 1) / WARPS, WARPS * 32, 0, st>>>(m.down, R, m.lo, m.inj, HC, m.inject, m.xn, D);
    a_silu_scaled<<<(R * T + 255) / 256, 256, 0, st>>>(m.lo, R * T);
    a_gemv<T, 8><<<(D * 8 + WARPS * 32 - 1) / (WARPS * 32), WARPS * 32, 0, st>>>(m.up, D, m.gate, nullptr, 0, nullptr, m.lo, R);
    a_hc_pre<<<(E * T + 255) / 256, 256, 0, st>>>(m, T);
}

// ---- B: two launches ----

// every CTA: the HC x T scales (a warp a pair), then a warp a row of down (r < R, silu_scaled in
// the epilogue) or inject, on xn made from x as it streams the row
template <int T> __global__ void __launch_bounds__(WARPS * 32) b_down(const float * x, mix_buffers m) {
    __shared__ float scale[T][HC];
    const int        warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int p = warp; p < T * HC; p += WARPS) {
        const float * xs = x + (size_t) (p / HC) * D + (p % HC) * E;
        float         ss = 0.0f;
        for (int e = lane; e < E; e += 32) {
            ss += xs[e] * xs[e];
        }
        ss = warp_sum(ss);
        if (lane == 0) {
            scale[p / HC][p % HC] = rsqrtf(ss / E + EPS);
        }
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x < T * HC) {
        m.scale[threadIdx.x] = scale[threadIdx.x / HC][threadIdx.x % HC];
    }
    const int row = blockIdx.x * WARPS + warp;
    if (row >= R + HC) {
        return;
    }
    const __half * w      = row < R ? m.down + (size_t) row * D : m.inj + (size_t) (row - R) * D;
    float          acc[T] = {};
    for (int c = lane; c < D / CHUNK; c += 32) {
        const int k = c * CHUNK, s = k / E;
        float     f[CHUNK];
        load_chunk(w + k, f);
        const float4 n0 = *(const float4 *) (m.w_norm + k);
        const float4 n1 = *((const float4 *) (m.w_norm + k) + 1);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float4 x0 = *(const float4 *) (x + (size_t) t * D + k);
            const float4 x1 = *((const float4 *) (x + (size_t) t * D + k) + 1);
            const float  sc = scale[t][s];
            acc[t] += f[0] * (x0.x * sc * n0.x) + f[1] * (x0.y * sc * n0.y) + f[2] * (x0.z * sc * n0.z) +
                      f[3] * (x0.w * sc * n0.w) + f[4] * (x1.x * sc * n1.x) + f[5] * (x1.y * sc * n1.y) +
                      f[6] * (x1.z * sc * n1.z) + f[7] * (x1.w * sc * n1.w);
        }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        acc[t] = warp_sum(acc[t]);
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (row < R) {
                const float v          = acc[t] / HC;
                m.lo[(size_t) t * R + row] = v / (1.0f + expf(-v));
            } else {
                m.inject[(size_t) t * HC + row - R] = acc[t];
            }
        }
    }
}

// a warp a column e: lanes 8 s .. 8 s + 7 take up's row e + s E (40 chunks, 5 a lane), then the
// sigmoid gate on xn and the mean over the 4 streams across the lane groups
template <int T> __global__ void __launch_bounds__(WARPS * 32) b_up(const float * x, mix_buffers m) {
    __shared__ float lo[T][R];
    for (int i = threadIdx.x; i < T * R; i += blockDim.x) {
        lo[i / R][i % R] = m.lo[i];
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int e = blockIdx.x * WARPS + warp, s = lane / 8, l = lane % 8;
    if (e >= E) {
        return;
    }
    const size_t   k      = (size_t) s * E + e;
    const __half * w      = m.up + k * R;
    float          acc[T] = {};
    for (int c = l; c < R / CHUNK; c += 8) {
        float f[CHUNK];
        load_chunk(w + c * CHUNK, f);
#pragma unroll
        for (int t = 0; t < T; ++t) {
#pragma unroll
            for (int i = 0; i < CHUNK; ++i) {
                acc[t] += f[i] * lo[t][c * CHUNK + i];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float g  = warp_sum(acc[t], 8);
        const float xn = x[(size_t) t * D + k] * m.scale[t * HC + s] * m.w_norm[k];
        float       v  = xn / (1.0f + expf(-g));
        v += __shfl_xor_sync(0xffffffff, v, 8);
        v += __shfl_xor_sync(0xffffffff, v, 16);
        if (lane == 0) {
            m.mixed[(size_t) t * E + e] = v / HC;
        }
    }
}

template <int T> void run_b(const float * x, const mix_buffers & m, cudaStream_t st) {
    b_down<T><<<(R + HC + WARPS - 1) / WARPS, WARPS * 32, 0, st>>>(x, m);
    b_up<T><<<(E + WARPS - 1) / WARPS, WARPS * 32, 0, st>>>(x, m);
}

// ---- host: data, the double reference, timings ----

struct host_mix {
    std::vector<float>  w_norm;
    std::vector<__half> down, inj, up;
};

void reference(const std::vector<float> & x, const host_mix & h, int T, std::vector<double> & mixed,
               std::vector<double> & inject) {
    mixed.assign((size_t) T * E, 0.0);
    inject.assign((size_t) T * HC, 0.0);
    for (int t = 0; t < T; ++t) {
        std::vector<double> xn(D), lo(R);
        for (int s = 0; s < HC; ++s) {
            double ss = 0.0;
            for (int e = 0; e < E; ++e) {
                ss += (double) x[(size_t) t * D + s * E + e] * x[(size_t) t * D + s * E + e];
            }
            const double sc = 1.0 / std::sqrt(ss / E + EPS);
            for (int e = 0; e < E; ++e) {
                xn[s * E + e] = x[(size_t) t * D + s * E + e] * sc * h.w_norm[s * E + e];
            }
        }
        for (int r = 0; r < R; ++r) {
            double a = 0.0;
            for (int k = 0; k < D; ++k) {
                a += (double) __half2float(h.down[(size_t) r * D + k]) * xn[k];
            }
            a /= HC;
            lo[r] = a / (1.0 + std::exp(-a));
        }
        for (int c = 0; c < HC; ++c) {
            for (int k = 0; k < D; ++k) {
                inject[(size_t) t * HC + c] += (double) __half2float(h.inj[(size_t) c * D + k]) * xn[k];
            }
        }
        for (int e = 0; e < E; ++e) {
            double sum = 0.0;
            for (int s = 0; s < HC; ++s) {
                double g = 0.0;
                for (int r = 0; r < R; ++r) {
                    g += (double) __half2float(h.up[((size_t) s * E + e) * R + r]) * lo[r];
                }
                sum += xn[s * E + e] / (1.0 + std::exp(-g));
            }
            mixed[(size_t) t * E + e] = sum / HC;
        }
    }
}

// max |a - ref| over max |ref|
double rel_err(const std::vector<float> & a, const std::vector<double> & ref) {
    double err = 0.0, mag = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, std::fabs(a[i] - ref[i]));
        mag = std::max(mag, std::fabs(ref[i]));
    }
    return err / mag;
}

template <typename F> float median_us_per_mix(F && capture, cudaStream_t st) {
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
        if (i >= 3) {  // the first replays warm the instruction caches
            us.push_back(ms * 1000.0f / MIXES);
        }
    }
    std::sort(us.begin(), us.end());
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    return us[us.size() / 2];
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

template <int T> bool study(const std::vector<mix_buffers> & mixes, const host_mix & h0, cudaStream_t st) {
    std::mt19937                          rng(T);
    std::normal_distribution<float>       nd(0.0f, 1.0f);
    std::vector<float>                    hx((size_t) T * D);
    for (float & v : hx) {
        v = nd(rng);
    }
    float *             x = upload(hx);
    std::vector<double> ref_mixed, ref_inject;
    reference(hx, h0, T, ref_mixed, ref_inject);

    bool ok = true;
    for (int variant = 0; variant < 2; ++variant) {
        variant == 0 ? run_a<T>(x, mixes[0], st) : run_b<T>(x, mixes[0], st);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaStreamSynchronize(st));
        const double em = rel_err(download(mixes[0].mixed, (size_t) T * E), ref_mixed);
        const double ei = rel_err(download(mixes[0].inject, (size_t) T * HC), ref_inject);
        const bool   pass = em < 1e-4 && ei < 1e-4;
        std::printf("T=%d %s: mixed rel err %.2e, inject %.2e: %s\n", T, variant == 0 ? "A (5 launches)" : "B (2 launches)",
                    em, ei, pass ? "ok" : "FAILED");
        ok = ok && pass;
    }
    if (!ok) {
        return false;
    }
    const float  a     = median_us_per_mix([&] { for (const auto & m : mixes) run_a<T>(x, m, st); }, st);
    const float  b     = median_us_per_mix([&] { for (const auto & m : mixes) run_b<T>(x, m, st); }, st);
    const double bytes = ((double) (R + HC) * D + (double) D * R) * sizeof(__half);
    std::printf("T=%d: us a mix (graph of %d, median of 20): A %.2f (%.0f GB/s), B %.2f (%.0f GB/s); a step's %d mixes "
                "%.3f -> %.3f ms\n",
                T, MIXES, a, bytes / a / 1e3, b, bytes / b / 1e3, MIXES, a * MIXES / 1e3, b * MIXES / 1e3);
    CHECK_CUDA(cudaFree(x));
    return true;
}

}  // namespace

int main() {
    // one set of weights, a copy a mix: the 96 copies' addresses keep a graph's reads out of L2
    std::mt19937                    rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    host_mix                        h0;
    h0.w_norm.resize(D);
    for (float & v : h0.w_norm) {
        v = 1.0f + 0.1f * nd(rng);
    }
    auto fill = [&](std::vector<__half> & w, size_t n, float sd) {
        w.resize(n);
        for (auto & v : w) {
            v = __float2half(sd * nd(rng));
        }
    };
    fill(h0.down, (size_t) R * D, 1.0f / std::sqrt((float) D));
    fill(h0.inj, (size_t) HC * D, 1.0f / std::sqrt((float) D));
    fill(h0.up, (size_t) D * R, 1.0f / std::sqrt((float) R));
    std::vector<mix_buffers> mixes(MIXES);
    for (mix_buffers & m : mixes) {
        m.w_norm = upload(h0.w_norm);
        m.down   = upload(h0.down);
        m.inj    = upload(h0.inj);
        m.up     = upload(h0.up);
        float *      outs[6];
        const size_t sizes[6] = { (size_t) 8 * D, (size_t) 8 * R, (size_t) 8 * HC, (size_t) 8 * D, (size_t) 8 * HC,
                                  (size_t) 8 * E };
        for (int j = 0; j < 6; ++j) {
            CHECK_CUDA(cudaMalloc(&outs[j], sizes[j] * sizeof(float)));
        }
        m.xn = outs[0], m.lo = outs[1], m.inject = outs[2], m.gate = outs[3], m.scale = outs[4], m.mixed = outs[5];
    }
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("hc-mix on %s: E=%d HC=%d R=%d, %d mixes a graph, %.1f MB of f16 weights a mix\n", prop.name, E, HC, R,
                MIXES, ((double) (R + HC) * D + (double) D * R) * 2 / 1e6);
    const bool ok = study<1>(mixes, h0, st) && study<8>(mixes, h0, st);
    return ok ? 0 : 1;
}
