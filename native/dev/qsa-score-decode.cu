// Study: qsa_score at a decode step (one query a stream), Flash-Next's indexer (D 128, 4 heads),
// 65536 block keys a stream (256K) and 8192 (32K), 1 and 8 streams. The op reads 32 MB of f32
// keys a stream; the library's kernel takes them at ~2.4 TB/s at one stream and ~3.5 at eight
// (H200, test-qsa-ops perf), so the question is which form reads them nearest the card's rate.
//   A   the library's kernel (qsa-score.cu): a warp 4 blocks, lane element d = 32 i + lane, scalar loads
//   V4  the same, lane elements 4 lane + 128 i as one 16-byte load
//   V8  V4 with 8 blocks a warp (the butterfly halves the values a lane holds three times)
//   P4  V4 looping over groups of 4 blocks a warp (grid of a few CTAs a SM), the next group's keys
//       loaded before the current group's products
// Every form's block score is the same tree of adds whatever the block's place in its warp, so
// keys that repeat give equal scores bit for bit (checked). Checked against a double reference
// first; timed as median of 20 CUDA graphs of 16 launches, each launch on another copy of the keys
// (copies past twice the L2, so every launch reads from HBM, as a decode step's does).
#include "cuda-check.cuh"
#include "graph-timing.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int WARP  = 32;
constexpr int WARPS = 8;
constexpr int D     = 128;
constexpr int NH    = 4;

struct args {
    const float * q;     // [D, NH, ns]
    const float * keys;  // [D, n_blocks, ns]
    float *       dst;   // [n_blocks, ns]
    int           n_blocks;
    float         scale;
};

// lanes 8j .. 8j + 7 get the warp's sum of v[j]: the plain butterfly's tree for each j
__device__ __forceinline__ float warp_sums4(const float (&v)[4], int lane) {
    const bool hi16 = lane & 16, hi8 = lane & 8;
    float      k0 = hi16 ? v[2] : v[0], k1 = hi16 ? v[3] : v[1];
    const float s0 = hi16 ? v[0] : v[2], s1 = hi16 ? v[1] : v[3];
    k0 += __shfl_xor_sync(0xffffffffu, s0, 16);
    k1 += __shfl_xor_sync(0xffffffffu, s1, 16);
    float x = hi8 ? k1 : k0;
    x += __shfl_xor_sync(0xffffffffu, hi8 ? k0 : k1, 8);
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

// lanes 4j .. 4j + 3 get the warp's sum of v[j]
__device__ __forceinline__ float warp_sums8(const float (&v)[8], int lane) {
    const bool hi16 = lane & 16, hi8 = lane & 8, hi4 = lane & 4;
    float      k[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float keep = hi16 ? v[4 + i] : v[i], send = hi16 ? v[i] : v[4 + i];
        k[i]             = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
    float m[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float keep = hi8 ? k[2 + i] : k[i], send = hi8 ? k[i] : k[2 + i];
        m[i]             = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    float x = hi4 ? m[1] : m[0];
    x += __shfl_xor_sync(0xffffffffu, hi4 ? m[0] : m[1], 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x;
}

// A: the library's kernel at D 128 (DPL 4), one query
__global__ void score_a(const args a) {
    constexpr int BPW = 4, DPL = D / WARP;
    const int     lane = threadIdx.x % WARP;
    const int     b0   = (blockIdx.x * WARPS + threadIdx.x / WARP) * BPW;
    const int     s    = blockIdx.y;
    if (b0 >= a.n_blocks) {
        return;
    }
    float kv[BPW][DPL];
#pragma unroll
    for (int j = 0; j < BPW; ++j) {
        const float * key = a.keys + ((size_t) s * a.n_blocks + min(b0 + j, a.n_blocks - 1)) * D;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            kv[j][i] = key[i * WARP + lane];
        }
    }
    const int mine = b0 + lane / 8;
    float     acc  = 0.0f;
    for (int h = 0; h < NH; ++h) {
        const float * qrow = a.q + ((size_t) s * NH + h) * D;
        float         dot[BPW] = {};
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const float qi = qrow[i * WARP + lane];
#pragma unroll
            for (int j = 0; j < BPW; ++j) {
                dot[j] = fmaf(qi, kv[j][i], dot[j]);
            }
        }
        acc += fmaxf(warp_sums4(dot, lane), 0.0f);
    }
    if (lane % 8 == 0 && mine < a.n_blocks) {
        a.dst[(size_t) s * a.n_blocks + mine] = acc * a.scale;
    }
}

// a lane's dot of its 4 elements, in element order
__device__ __forceinline__ float dot4(float4 q, float4 k) {
    return fmaf(q.w, k.w, fmaf(q.z, k.z, fmaf(q.y, k.y, q.x * k.x)));
}

// V4 / V8: BPW blocks a warp, lane elements 4 lane .. 4 lane + 3 (D 128: one float4 a block)
template <int BPW> __global__ void score_v(const args a) {
    const int lane = threadIdx.x % WARP;
    const int b0   = (blockIdx.x * WARPS + threadIdx.x / WARP) * BPW;
    const int s    = blockIdx.y;
    if (b0 >= a.n_blocks) {
        return;
    }
    float4 kv[BPW];
#pragma unroll
    for (int j = 0; j < BPW; ++j) {
        kv[j] = ((const float4 *) (a.keys + ((size_t) s * a.n_blocks + min(b0 + j, a.n_blocks - 1)) * D))[lane];
    }
    const int mine = b0 + lane / (WARP / BPW);
    float     acc  = 0.0f;
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        const float4 qv = ((const float4 *) (a.q + ((size_t) s * NH + h) * D))[lane];
        float        dot[BPW];
#pragma unroll
        for (int j = 0; j < BPW; ++j) {
            dot[j] = dot4(qv, kv[j]);
        }
        if constexpr (BPW == 4) {
            acc += fmaxf(warp_sums4(dot, lane), 0.0f);
        } else {
            acc += fmaxf(warp_sums8(dot, lane), 0.0f);
        }
    }
    if (lane % (WARP / BPW) == 0 && mine < a.n_blocks) {
        a.dst[(size_t) s * a.n_blocks + mine] = acc * a.scale;
    }
}

// P4: a warp takes groups of 4 blocks g, g + G, ... (G the grid's warps a stream), loading the
// next group's keys before the current group's products
__global__ void score_p(const args a) {
    constexpr int BPW  = 4;
    const int     lane = threadIdx.x % WARP;
    const int     s    = blockIdx.y;
    const int     n_g  = (a.n_blocks + BPW - 1) / BPW;
    const int     step = gridDim.x * WARPS;
    int           g    = blockIdx.x * WARPS + threadIdx.x / WARP;
    if (g >= n_g) {
        return;
    }
    float4 qv[NH];
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        qv[h] = ((const float4 *) (a.q + ((size_t) s * NH + h) * D))[lane];
    }
    const float4 * keys = (const float4 *) (a.keys + (size_t) s * a.n_blocks * D);
    float4         kv[BPW];
#pragma unroll
    for (int j = 0; j < BPW; ++j) {
        kv[j] = keys[(size_t) min(g * BPW + j, a.n_blocks - 1) * (D / 4) + lane];
    }
    for (;;) {
        const int next = g + step;
        float4    nv[BPW];
        if (next < n_g) {
#pragma unroll
            for (int j = 0; j < BPW; ++j) {
                nv[j] = keys[(size_t) min(next * BPW + j, a.n_blocks - 1) * (D / 4) + lane];
            }
        }
        float acc = 0.0f;
#pragma unroll
        for (int h = 0; h < NH; ++h) {
            float dot[BPW];
#pragma unroll
            for (int j = 0; j < BPW; ++j) {
                dot[j] = dot4(qv[h], kv[j]);
            }
            acc += fmaxf(warp_sums4(dot, lane), 0.0f);
        }
        const int mine = g * BPW + lane / 8;
        if (lane % 8 == 0 && mine < a.n_blocks) {
            a.dst[(size_t) s * a.n_blocks + mine] = acc * a.scale;
        }
        if (next >= n_g) {
            break;
        }
        g = next;
#pragma unroll
        for (int j = 0; j < BPW; ++j) {
            kv[j] = nv[j];
        }
    }
}

enum form { FORM_A, FORM_V4, FORM_V8, FORM_P4, N_FORMS };
const char * form_name[N_FORMS] = { "A", "V4", "V8", "P4" };

// sms: the device's SMs (P4's grid)
void launch(form f, const args & a, int ns, int sms, cudaStream_t st) {
    const int blocks_a_cta4 = WARPS * 4, blocks_a_cta8 = WARPS * 8;
    switch (f) {
        case FORM_A:
            score_a<<<dim3((a.n_blocks + blocks_a_cta4 - 1) / blocks_a_cta4, ns), WARPS * WARP, 0, st>>>(a);
            break;
        case FORM_V4:
            score_v<4><<<dim3((a.n_blocks + blocks_a_cta4 - 1) / blocks_a_cta4, ns), WARPS * WARP, 0, st>>>(a);
            break;
        case FORM_V8:
            score_v<8><<<dim3((a.n_blocks + blocks_a_cta8 - 1) / blocks_a_cta8, ns), WARPS * WARP, 0, st>>>(a);
            break;
        case FORM_P4:
            {
                // about 8 CTAs a SM in all, split over the streams
                const int per_stream = std::max(1, std::min((a.n_blocks + blocks_a_cta4 - 1) / blocks_a_cta4,
                                                            8 * sms / ns));
                score_p<<<dim3(per_stream, ns), WARPS * WARP, 0, st>>>(a);
                break;
            }
        default: break;
    }
}

struct shape {
    int ns, n_blocks;
};

}  // namespace

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("qsa-score-decode: %s, %d SMs, L2 %d MB; D %d, %d heads, one query a stream\n", prop.name,
                prop.multiProcessorCount, prop.l2CacheSize >> 20, D, NH);
    const shape shapes[] = { { 1, 65536 }, { 8, 65536 }, { 1, 8192 }, { 8, 8192 } };
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    bool all_ok = true;
    for (const shape & sh : shapes) {
        const size_t n_keys = (size_t) sh.ns * sh.n_blocks * D;
        const size_t bytes  = n_keys * sizeof(float);
        const int    copies = (int) std::max<size_t>(2, (4 * (size_t) prop.l2CacheSize) / bytes + 1);
        std::mt19937 rng(1234 + sh.ns * 7 + sh.n_blocks);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> q((size_t) sh.ns * NH * D), keys(n_keys);
        for (float & v : q) v = nd(rng);
        for (float & v : keys) v = nd(rng);
        // blocks that repeat block 0's key, at every place in a group of 4 and of 8
        const int dups[] = { 1, 2, 3, 5, 6, 7, 9, 12, 4099 };
        for (int s = 0; s < sh.ns; ++s) {
            for (int b : dups) {
                std::copy_n(&keys[(size_t) s * sh.n_blocks * D], D, &keys[((size_t) s * sh.n_blocks + b) * D]);
            }
        }
        const float scale = 0.088f;
        std::vector<double> ref((size_t) sh.ns * sh.n_blocks);
        double              mag = 0.0;
        for (int s = 0; s < sh.ns; ++s) {
            for (int b = 0; b < sh.n_blocks; ++b) {
                double acc = 0.0;
                for (int h = 0; h < NH; ++h) {
                    double d = 0.0;
                    for (int e = 0; e < D; ++e) {
                        d += (double) q[((size_t) s * NH + h) * D + e] * keys[((size_t) s * sh.n_blocks + b) * D + e];
                    }
                    acc += std::max(d, 0.0);
                }
                ref[(size_t) s * sh.n_blocks + b] = acc * scale;
                mag = std::max(mag, std::fabs(acc * scale));
            }
        }
        float *q_d, *keys_d, *dst_d;
        CHECK_CUDA(cudaMalloc(&q_d, q.size() * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&keys_d, bytes * copies));
        CHECK_CUDA(cudaMalloc(&dst_d, ref.size() * sizeof(float)));
        CHECK_CUDA(cudaMemcpy(q_d, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
        for (int c = 0; c < copies; ++c) {
            CHECK_CUDA(cudaMemcpy(keys_d + c * n_keys, keys.data(), bytes, cudaMemcpyHostToDevice));
        }
        std::printf("\nns %d, %d blocks (%.1f MB of keys a launch, %d copies)\n", sh.ns, sh.n_blocks, bytes / 1e6,
                    copies);
        for (int f = 0; f < N_FORMS; ++f) {
            const args a = { q_d, keys_d, dst_d, sh.n_blocks, scale };
            CHECK_CUDA(cudaMemset(dst_d, 0xff, ref.size() * sizeof(float)));
            launch((form) f, a, sh.ns, prop.multiProcessorCount, st);
            CHECK_CUDA(cudaGetLastError());
            CHECK_CUDA(cudaStreamSynchronize(st));
            std::vector<float> out(ref.size());
            CHECK_CUDA(cudaMemcpy(out.data(), dst_d, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
            double err = 0.0;
            bool   ties = true;
            for (size_t i = 0; i < out.size(); ++i) {
                err = std::max(err, std::fabs(out[i] - ref[i]) / mag);
            }
            for (int s = 0; s < sh.ns; ++s) {
                for (int b : dups) {
                    ties = ties && out[(size_t) s * sh.n_blocks + b] == out[(size_t) s * sh.n_blocks];
                }
            }
            const bool ok = err < 1e-5 && ties;
            all_ok        = all_ok && ok;
            std::printf("  %-3s max |err| / max |score| %.2e, repeated keys tie %s: %s", form_name[f], err,
                        ties ? "yes" : "NO", ok ? "OK" : "FAIL\n");
            if (!ok) {
                continue;  // a failed form is not timed
            }
            // 16 launches a graph, each on the next copy
            const launch_times t = time_launches(st, 16, [&](int i) {
                const args ai = { q_d, keys_d + (size_t) (i % copies) * n_keys, dst_d, sh.n_blocks, scale };
                launch((form) f, ai, sh.ns, prop.multiProcessorCount, st);
            });
            std::printf("; %8.2f us a launch (%.2f-%.2f), %.0f GB/s\n", t.median, t.min, t.max,
                        bytes / (t.median * 1e3));
        }
        CHECK_CUDA(cudaFree(q_d));
        CHECK_CUDA(cudaFree(keys_d));
        CHECK_CUDA(cudaFree(dst_d));
    }
    std::printf("\n%s\n", all_ok ? "all forms passed" : "a form FAILED");
    return all_ok ? 0 : 1;
}
