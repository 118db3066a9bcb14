// Dev corner (see README.md here): the gated delta rule of Flash-Next's linear-attention layers
// (upstream's GGML_OP_GATED_DELTA_NET, scalar gate) over a prefill chunk, token by token against
// chunked, before anything moves into native/ggml.
//
// Per head the state S [dk x dv] (dk = dv = 128) evolves token by token:
//   S_t = e^{g_t} S_{t-1} + k_t d_t^T,  d_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),  o_t = S_t^T q_t / sqrt(dk)
// Variant 1 is that recurrence as upstream's CUDA kernel runs it: one warp a column of S, every
// token two warp sums (1357 us a layer for 2048 tokens on the H200, session 12: bound by those
// instructions, not by loads; staging the inputs ahead did not help). Variant 2 is chunked: with
// b_t = g_1 + .. + g_t inside a chunk of C tokens starting from state S_0,
//   S_t = e^{b_t} S_0 + sum_{s <= t} e^{b_t - b_s} k_s d_s^T, so the chunk's d rows solve
//   (I + A) D = diag(beta) (V - diag(e^b) K S_0),  A_ts = beta_t e^{b_t - b_s} k_t . k_s (s < t),
//   i.e. D = U - W S_0 with U = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta e^b) K;
//   O   = diag(e^b) Q S_0 + P D,  P_ts = e^{b_t - b_s} q_t . k_s (s <= t);
//   S_C = e^{b_C} S_0 + (diag(e^{b_C - b}) K)^T D.
// (checked in float64 against the recurrence: equal to 1e-15.) Phase 1 (every chunk of every head
// at once) computes U, W and P; phase 2 walks the chunks of a head in order, a CTA per slice of CS
// state columns (the columns of S are independent). All f32 FMAs on CUDA cores, as the reference
// is f32; the sums are reassociated, so the check is against a double-precision recurrence.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda native/dev/gdn-chunked.cu -o /tmp/gdn-chunked && /tmp/gdn-chunked
#include "mma-ptx.cuh"

#include "cuda-check.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace pyqsa_mma;

namespace {

constexpr int SD = 128;  // dk = dv
constexpr int C  = 64;   // tokens of a chunk
constexpr int KP = SD + 1;  // padded row of a [C][SD] tile in shared memory

// Layouts, as ggml's op: q, k [T][H_qk][SD]; v, o [T][H][SD]; g, beta [T][H]; a state
// [H][SD (column j)][SD (row i)]: column j of head h's S at (h * SD + j) * SD.
struct problem {
    int T, H, H_qk;
    const float *q, *k, *v, *g, *beta, *s0;
    float *o, *s1;
    float scale;
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

// ---- variant 1: token by token, a warp a column (grid (H, SD / 4), block (32, 4))
__global__ void __launch_bounds__(128) gdn_recurrent(const problem p) {
    constexpr int RPL = SD / 32;
    const int h = blockIdx.x, lane = threadIdx.x, col = blockIdx.y * 4 + threadIdx.y, hq = h % p.H_qk;
    float s[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) s[r] = p.s0[((size_t) h * SD + col) * SD + r * 32 + lane];
    for (int t = 0; t < p.T; ++t) {
        const float * kt = p.k + ((size_t) t * p.H_qk + hq) * SD;
        const float * qt = p.q + ((size_t) t * p.H_qk + hq) * SD;
        const float   e = expf(p.g[(size_t) t * p.H + h]), beta = p.beta[(size_t) t * p.H + h];
        float kr[RPL], qr[RPL], kv = 0.0f;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            kr[r] = kt[r * 32 + lane];
            qr[r] = qt[r * 32 + lane];
            kv += s[r] * kr[r];
        }
        kv = warp_sum(kv);
        const float d = (p.v[((size_t) t * p.H + h) * SD + col] - e * kv) * beta;
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            s[r] = e * s[r] + kr[r] * d;
            o += s[r] * qr[r];
        }
        o = warp_sum(o);
        if (lane == 0) p.o[((size_t) t * p.H + h) * SD + col] = o * p.scale;
    }
#pragma unroll
    for (int r = 0; r < RPL; ++r) p.s1[((size_t) h * SD + col) * SD + r * 32 + lane] = s[r];
}

// ---- variant 3: token by token, LANES lanes a column (SD / LANES rows each: log2(LANES) shuffle
// steps a sum, where variant 1 takes 5), 256 threads = 256 / LANES columns a CTA, and every 32
// tokens' q and k rows, the CTA's v columns, decays and betas staged in shared memory ahead of use
// (cp.async, two stages), so that a token's chain has no global load in it; the outputs leave
// through shared memory, a tile at a time, coalesced. grid (H, SD / (256 / LANES)), 256 threads.
constexpr int V3_THREADS = 256, V3_TT = 32;

template <int LANES> struct v3_smem {
    static constexpr int COLS = V3_THREADS / LANES;
    float q[2][V3_TT][SD];
    float k[2][V3_TT][SD];
    float v[2][V3_TT][COLS];
    float o[V3_TT][COLS];
    float e[2][V3_TT];
    float beta[2][V3_TT];
};

template <int LANES>
__global__ void __launch_bounds__(V3_THREADS) gdn_recurrent_staged(const problem p) {
    using SM           = v3_smem<LANES>;
    constexpr int COLS = SM::COLS, RPL = SD / LANES;
    extern __shared__ __align__(16) char raw[];
    SM &      sm  = *(SM *) raw;
    const int h = blockIdx.x, hq = h % p.H_qk, col0 = blockIdx.y * COLS;
    const int tid = threadIdx.x, cl = tid / LANES, sub = tid % LANES, col = col0 + cl;
    float     s[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) s[r] = p.s0[((size_t) h * SD + col) * SD + sub * RPL + r];
    const auto stage = [&](int buf, int tile) {
        const int t0 = tile * V3_TT;
        for (int i = tid; i < V3_TT * SD / 4; i += V3_THREADS) {
            const int t = i / (SD / 4), c4 = i % (SD / 4);
            if (t0 + t < p.T) {
                const size_t at = ((size_t) (t0 + t) * p.H_qk + hq) * SD + c4 * 4;
                cp_async_16(&sm.q[buf][t][c4 * 4], p.q + at);
                cp_async_16(&sm.k[buf][t][c4 * 4], p.k + at);
            }
        }
        for (int i = tid; i < V3_TT * COLS / 4; i += V3_THREADS) {
            const int t = i / (COLS / 4), c4 = i % (COLS / 4);
            if (t0 + t < p.T) cp_async_16(&sm.v[buf][t][c4 * 4], p.v + ((size_t) (t0 + t) * p.H + h) * SD + col0 + c4 * 4);
        }
        if (tid < V3_TT) {
            const int  t  = t0 + tid;
            const bool in = t < p.T;
            sm.e[buf][tid]    = in ? expf(p.g[(size_t) t * p.H + h]) : 0.0f;
            sm.beta[buf][tid] = in ? p.beta[(size_t) t * p.H + h] : 0.0f;
        }
    };
    const int n_tiles = (p.T + V3_TT - 1) / V3_TT;
    stage(0, 0);
    cp_async_commit();
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int buf = tile & 1, n = min(V3_TT, p.T - tile * V3_TT);
        if (tile + 1 < n_tiles) stage(buf ^ 1, tile + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        for (int t = 0; t < n; ++t) {
            float k[RPL], q[RPL];
#pragma unroll
            for (int j = 0; j < RPL / 4; ++j) {
                const float4 a = *(const float4 *) &sm.k[buf][t][sub * RPL + 4 * j];
                const float4 b = *(const float4 *) &sm.q[buf][t][sub * RPL + 4 * j];
                k[4 * j] = a.x; k[4 * j + 1] = a.y; k[4 * j + 2] = a.z; k[4 * j + 3] = a.w;
                q[4 * j] = b.x; q[4 * j + 1] = b.y; q[4 * j + 2] = b.z; q[4 * j + 3] = b.w;
            }
            // four partial sums: dependent chains of RPL / 4 FMAs
            float kv4[4] = {};
#pragma unroll
            for (int r = 0; r < RPL; ++r) kv4[r % 4] += s[r] * k[r];
            float kv = (kv4[0] + kv4[1]) + (kv4[2] + kv4[3]);
#pragma unroll
            for (int m = 1; m < LANES; m <<= 1) kv += __shfl_xor_sync(0xffffffffu, kv, m);
            const float e = sm.e[buf][t];
            const float d = (sm.v[buf][t][cl] - e * kv) * sm.beta[buf][t];
            float       o4[4] = {};
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                s[r] = e * s[r] + k[r] * d;
                o4[r % 4] += s[r] * q[r];
            }
            float o = (o4[0] + o4[1]) + (o4[2] + o4[3]);
#pragma unroll
            for (int m = 1; m < LANES; m <<= 1) o += __shfl_xor_sync(0xffffffffu, o, m);
            if (sub == 0) sm.o[t][cl] = o * p.scale;
        }
        __syncthreads();
        for (int i = tid; i < n * COLS; i += V3_THREADS) {
            const int t = i / COLS, c = i % COLS;
            p.o[((size_t) (tile * V3_TT + t) * p.H + h) * SD + col0 + c] = sm.o[t][c];
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < RPL; ++r) p.s1[((size_t) h * SD + col) * SD + sub * RPL + r] = s[r];
}

// ---- variant 2, phase 1: one CTA a (chunk, head), 256 threads
// writes U, W [H][n_chunks][C][SD], P [H][n_chunks][C][C] and b [H][T]
struct chunk_out {
    float *u, *w, *pm, *b;
};

constexpr size_t PREP_SMEM = (2 * (size_t) C * KP + (size_t) C * (C + 1) + 2 * C) * sizeof(float);

__global__ void __launch_bounds__(256) gdn_chunk_prep(const problem p, const chunk_out co) {
    extern __shared__ float sm[];
    float * ks = sm;                  // [C][KP]
    float * qs = ks + C * KP;         // [C][KP]
    float * am = qs + C * KP;         // [C][C + 1]: A, then P
    float * bs = am + C * (C + 1);    // [C] b
    float * bb = bs + C;              // [C] beta
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, hq = h % p.H_qk;
    const int t0 = c * C, n = min(C, p.T - t0), n_chunks = gridDim.x;

    for (int i = tid; i < C * SD; i += 256) {
        const int t = i / SD, d = i % SD;
        const bool in = t < n;
        ks[t * KP + d] = in ? p.k[((size_t) (t0 + t) * p.H_qk + hq) * SD + d] : 0.0f;
        qs[t * KP + d] = in ? p.q[((size_t) (t0 + t) * p.H_qk + hq) * SD + d] : 0.0f;
    }
    if (tid < 32) {  // b = the chunk's running sum of g (rows past n keep the last value)
        float run = 0.0f;
        for (int j = 0; j < C; j += 32) {
            const int   t = j + tid;
            float       x = t < n ? p.g[(size_t) (t0 + t) * p.H + h] : 0.0f;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, x, o);
                if (tid >= o) x += y;
            }
            bs[t] = run + x;
            run += __shfl_sync(0xffffffffu, x, 31);
        }
    }
    for (int t = tid; t < C; t += 256) bb[t] = t < n ? p.beta[(size_t) (t0 + t) * p.H + h] : 0.0f;
    __syncthreads();

    // 4 x 4 tiles of the [C][C] products: rows ty*4.., columns tx*4..
    const int ty = tid / 16, tx = tid % 16;
    const auto gram = [&](const float * a, float (&acc)[4][4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (int d = 0; d < SD; ++d) {
            float x[4], y[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) x[i] = a[(ty * 4 + i) * KP + d];
#pragma unroll
            for (int j = 0; j < 4; ++j) y[j] = ks[(tx * 4 + j) * KP + d];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(x[i], y[j], acc[i][j]);
        }
    };
    float acc[4][4];
    gram(ks, acc);  // K K^T -> A (strictly lower)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = ty * 4 + i, s = tx * 4 + j;
            am[t * (C + 1) + s] = s < t ? bb[t] * expf(bs[t] - bs[s]) * acc[i][j] : 0.0f;
        }
    __syncthreads();

    // forward substitution, a thread a right-hand column: columns 0..SD-1 give U (beta v),
    // SD..2SD-1 give W (beta e^b k)
    {
        const int col = tid;
        float     x[C];
#pragma unroll
        for (int t = 0; t < C; ++t) {
            float r = col < SD ? (t < n ? bb[t] * p.v[((size_t) (t0 + t) * p.H + h) * SD + col] : 0.0f)
                               : bb[t] * expf(bs[t]) * ks[t * KP + col - SD];
#pragma unroll
            for (int s = 0; s < t; ++s) r = fmaf(-am[t * (C + 1) + s], x[s], r);
            x[t] = r;
        }
        float * dst = (col < SD ? co.u : co.w) + (((size_t) h * n_chunks + c) * C) * SD + (col % SD);
#pragma unroll
        for (int t = 0; t < C; ++t) dst[(size_t) t * SD] = x[t];
    }
    __syncthreads();

    gram(qs, acc);  // Q K^T -> P (lower, with the diagonal)
    float * pm = co.pm + ((size_t) h * n_chunks + c) * C * C;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = ty * 4 + i, s = tx * 4 + j;
            pm[t * C + s] = s <= t ? expf(bs[t] - bs[s]) * acc[i][j] : 0.0f;
        }
    for (int t = tid; t < n; t += 256) co.b[(size_t) h * p.T + t0 + t] = bs[t];
}

// ---- variant 2, phase 2: one CTA a (head, slice of CS state columns), the chunks in order
template <int CS> struct scan_smem {
    float s[SD][CS];     // the state slice: S[i][col0 + j]
    float d[C][CS + 1];  // the chunk's D slice
};

template <int CS>
__global__ void __launch_bounds__(256) gdn_chunk_scan(const problem p, const chunk_out co) {
    __shared__ scan_smem<CS> sm;
    const int h = blockIdx.x, col0 = blockIdx.y * CS, tid = threadIdx.x, hq = h % p.H_qk;
    const int n_chunks = (p.T + C - 1) / C;
    constexpr int RC = C * CS / 256;   // outputs of a thread in steps 1 and 2: row tid / (CS / RC)
    constexpr int SC = SD * CS / 256;  // outputs of a thread in step 3
    static_assert(CS % RC == 0 && CS % SC == 0, "slice");

    for (int i = tid; i < SD * CS; i += 256) {
        const int j = i / SD, r = i % SD;
        sm.s[r][j] = p.s0[((size_t) h * SD + col0 + j) * SD + r];
    }
    __syncthreads();

    for (int c = 0; c < n_chunks; ++c) {
        const int     t0 = c * C, n = min(C, p.T - t0);
        const size_t  ch = (size_t) h * n_chunks + c;
        const float * u  = co.u + ch * C * SD;
        const float * w  = co.w + ch * C * SD;
        const float * pm = co.pm + ch * C * C;
        const float * b  = co.b + (size_t) h * p.T + t0;

        // step 1: D = U - W S (rows r, RC columns from j0)
        const int r = tid / (CS / RC), j0 = (tid % (CS / RC)) * RC;
        {
            float acc[RC] = {};
            for (int d = 0; d < SD; ++d) {
                const float x = w[r * SD + d];
#pragma unroll
                for (int j = 0; j < RC; ++j) acc[j] = fmaf(x, sm.s[d][j0 + j], acc[j]);
            }
#pragma unroll
            for (int j = 0; j < RC; ++j) sm.d[r][j0 + j] = u[r * SD + col0 + j0 + j] - acc[j];
        }
        __syncthreads();

        // step 2: O = e^b (Q S) + P D
        if (r < n) {
            const float * qr = p.q + ((size_t) (t0 + r) * p.H_qk + hq) * SD;
            float         acc[RC] = {}, acc2[RC] = {};
            for (int d = 0; d < SD; ++d) {
                const float x = qr[d];
#pragma unroll
                for (int j = 0; j < RC; ++j) acc[j] = fmaf(x, sm.s[d][j0 + j], acc[j]);
            }
            for (int s = 0; s <= r; ++s) {
                const float x = pm[r * C + s];
#pragma unroll
                for (int j = 0; j < RC; ++j) acc2[j] = fmaf(x, sm.d[s][j0 + j], acc2[j]);
            }
            const float e = expf(b[r]);
            float *     o = p.o + ((size_t) (t0 + r) * p.H + h) * SD + col0 + j0;
#pragma unroll
            for (int j = 0; j < RC; ++j) o[j] = (e * acc[j] + acc2[j]) * p.scale;
        }
        __syncthreads();

        // step 3: S = e^{b_C} S + (diag(e^{b_C - b}) K)^T D (rows i, SC columns from k0)
        {
            const int   i = tid / (CS / SC), k0 = (tid % (CS / SC)) * SC;
            const float bl = b[n - 1];
            float       acc[SC] = {};
            for (int t = 0; t < n; ++t) {
                const float x = expf(bl - b[t]) * p.k[((size_t) (t0 + t) * p.H_qk + hq) * SD + i];
#pragma unroll
                for (int j = 0; j < SC; ++j) acc[j] = fmaf(x, sm.d[t][k0 + j], acc[j]);
            }
            const float e = expf(bl);
#pragma unroll
            for (int j = 0; j < SC; ++j) sm.s[i][k0 + j] = e * sm.s[i][k0 + j] + acc[j];
        }
        __syncthreads();
    }
    for (int i = tid; i < SD * CS; i += 256) {
        const int j = i / SD, r = i % SD;
        p.s1[((size_t) h * SD + col0 + j) * SD + r] = sm.s[r][j];
    }
}

// ---- host side
struct data {
    int T, H, H_qk;
    std::vector<float> q, k, v, g, beta, s0;
};

data make(int T, int H, int H_qk, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    data d{ T, H, H_qk, {}, {}, {}, {}, {}, {} };
    d.q.resize((size_t) T * H_qk * SD);
    d.k.resize(d.q.size());
    d.v.resize((size_t) T * H * SD);
    d.g.resize((size_t) T * H);
    d.beta.resize(d.g.size());
    d.s0.resize((size_t) H * SD * SD);
    for (std::vector<float> * x : { &d.q, &d.k }) {  // L2-normed rows, as the model's
        for (size_t r = 0; r < x->size(); r += SD) {
            double n2 = 0.0;
            for (int i = 0; i < SD; ++i) n2 += std::pow((*x)[r + i] = nd(rng), 2);
            for (int i = 0; i < SD; ++i) (*x)[r + i] = (float) ((*x)[r + i] / std::sqrt(n2));
        }
    }
    for (auto & x : d.v) x = nd(rng);
    for (auto & x : d.g) x = -2.0f * ud(rng);  // log-decays
    for (auto & x : d.beta) x = ud(rng);
    for (auto & x : d.s0) x = 0.1f * nd(rng);
    return d;
}

// the recurrence in double: o [T][H][SD], then the final state
std::vector<double> reference(const data & d) {
    std::vector<double> out((size_t) d.T * d.H * SD + (size_t) d.H * SD * SD);
    for (int h = 0; h < d.H; ++h) {
        const int hq = h % d.H_qk;
        std::vector<double> st(d.s0.begin() + (size_t) h * SD * SD, d.s0.begin() + (size_t) (h + 1) * SD * SD);
        for (int t = 0; t < d.T; ++t) {
            const float * q = &d.q[((size_t) t * d.H_qk + hq) * SD];
            const float * k = &d.k[((size_t) t * d.H_qk + hq) * SD];
            const double  e = std::exp((double) d.g[(size_t) t * d.H + h]), beta = d.beta[(size_t) t * d.H + h];
            for (int j = 0; j < SD; ++j) {
                double * col = &st[(size_t) j * SD];
                double   kv = 0.0, o = 0.0;
                for (int i = 0; i < SD; ++i) kv += col[i] * k[i];
                const double dl = (d.v[((size_t) t * d.H + h) * SD + j] - e * kv) * beta;
                for (int i = 0; i < SD; ++i) {
                    col[i] = e * col[i] + k[i] * dl;
                    o += col[i] * q[i];
                }
                out[((size_t) t * d.H + h) * SD + j] = o / std::sqrt((double) SD);
            }
        }
        std::copy(st.begin(), st.end(), out.begin() + (size_t) d.T * d.H * SD + (size_t) h * SD * SD);
    }
    return out;
}

struct device {
    problem   p;
    chunk_out co;
    std::vector<void *> bufs;

    float * alloc(size_t n) {
        void * ptr = nullptr;
        CHECK_CUDA(cudaMalloc(&ptr, n * sizeof(float)));
        bufs.push_back(ptr);
        return (float *) ptr;
    }
    float * upload(const std::vector<float> & x) {
        float * ptr = alloc(x.size());
        CHECK_CUDA(cudaMemcpy(ptr, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        return ptr;
    }
    explicit device(const data & d) {
        p.T = d.T; p.H = d.H; p.H_qk = d.H_qk;
        p.q = upload(d.q); p.k = upload(d.k); p.v = upload(d.v);
        p.g = upload(d.g); p.beta = upload(d.beta); p.s0 = upload(d.s0);
        p.o  = alloc((size_t) d.T * d.H * SD);
        p.s1 = alloc((size_t) d.H * SD * SD);
        p.scale = 1.0f / std::sqrt((float) SD);
        const size_t n_chunks = (d.T + C - 1) / C;
        co.u  = alloc((size_t) d.H * n_chunks * C * SD);
        co.w  = alloc((size_t) d.H * n_chunks * C * SD);
        co.pm = alloc((size_t) d.H * n_chunks * C * C);
        co.b  = alloc((size_t) d.H * d.T);
    }
    ~device() {
        for (void * b : bufs) cudaFree(b);
    }
    template <int LANES> void run_v3() {
        gdn_recurrent_staged<LANES><<<dim3(p.H, SD / v3_smem<LANES>::COLS), V3_THREADS, sizeof(v3_smem<LANES>)>>>(p);
        CHECK_CUDA(cudaGetLastError());
    }
    void run_v1() {
        gdn_recurrent<<<dim3(p.H, SD / 4), dim3(32, 4)>>>(p);
        CHECK_CUDA(cudaGetLastError());
    }
    template <int CS> void run_v2() {
        const int n_chunks = (p.T + C - 1) / C;
        gdn_chunk_prep<<<dim3(n_chunks, p.H), 256, PREP_SMEM>>>(p, co);
        CHECK_CUDA(cudaGetLastError());
        gdn_chunk_scan<CS><<<dim3(p.H, SD / CS), 256>>>(p, co);
        CHECK_CUDA(cudaGetLastError());
    }
    std::vector<float> result() const {
        std::vector<float> r((size_t) p.T * p.H * SD + (size_t) p.H * SD * SD);
        CHECK_CUDA(cudaMemcpy(r.data(), p.o, (size_t) p.T * p.H * SD * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(r.data() + (size_t) p.T * p.H * SD, p.s1, (size_t) p.H * SD * SD * sizeof(float),
                              cudaMemcpyDeviceToHost));
        return r;
    }
};

bool check(const char * name, const data & d, const std::vector<double> & ref, const std::vector<float> & got) {
    double err = 0.0, norm = 0.0, max_rel = 0.0, ref_max = 0.0;
    for (double x : ref) ref_max = std::max(ref_max, std::fabs(x));
    for (size_t i = 0; i < ref.size(); ++i) {
        const double e = got[i] - ref[i];
        err += e * e;
        norm += ref[i] * ref[i];
        max_rel = std::max(max_rel, std::fabs(e) / ref_max);
    }
    const double nm = err / norm;
    const bool   ok = std::isfinite(nm) && nm < 1e-10 && max_rel < 1e-4;
    std::printf("  %-28s T=%d H=%d H_qk=%d: nmse %.3e, max err / max |ref| %.3e: %s\n", name, d.T, d.H, d.H_qk, nm,
                max_rel, ok ? "OK" : "FAIL");
    return ok;
}

template <typename F> double time_us(F && f, int iters) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    std::vector<float> runs;
    for (int rep = 0; rep < 5; ++rep) {
        f();
        CHECK_CUDA(cudaEventRecord(a));
        for (int i = 0; i < iters; ++i) f();
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        runs.push_back(ms * 1000.0f / iters);
    }
    std::sort(runs.begin(), runs.end());
    std::printf("(%.1f-%.1f) ", runs.front(), runs.back());
    return runs[runs.size() / 2];
}

}  // namespace

int main() {
    CHECK_CUDA(cudaFuncSetAttribute(gdn_chunk_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) PREP_SMEM));
    CHECK_CUDA(cudaFuncSetAttribute(gdn_recurrent_staged<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) sizeof(v3_smem<4>)));
    CHECK_CUDA(cudaFuncSetAttribute(gdn_recurrent_staged<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) sizeof(v3_smem<8>)));
    CHECK_CUDA(cudaFuncSetAttribute(gdn_recurrent_staged<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) sizeof(v3_smem<16>)));
    std::mt19937 rng(5);
    bool ok = true;
    std::printf("checks against a double-precision recurrence (outputs and final state):\n");
    for (const int T : { 300, 64, 37, 1000 }) {
        const data d = make(T, 4, 2, rng);
        const std::vector<double> ref = reference(d);
        device g(d);
        g.run_v1();
        ok &= check("v1 token by token", d, ref, g.result());
        g.run_v2<32>();
        ok &= check("v2 chunked, 32-column slices", d, ref, g.result());
        g.run_v2<16>();
        ok &= check("v2 chunked, 16-column slices", d, ref, g.result());
        g.run_v3<4>();
        ok &= check("v3 staged, 4 lanes a column", d, ref, g.result());
        g.run_v3<8>();
        ok &= check("v3 staged, 8 lanes a column", d, ref, g.result());
        g.run_v3<16>();
        ok &= check("v3 staged, 16 lanes a column", d, ref, g.result());
    }
    if (!ok) {
        std::printf("a check failed: no timings\n");
        return 1;
    }
    std::printf("timings, Flash-Next's shape (H=32, H_qk=16, dk=dv=128), us a call, median of 5 runs (range):\n");
    for (const int T : { 512, 2048 }) {
        const data d = make(T, 32, 16, rng);
        device g(d);
        const int iters = 20;
        std::printf("  T=%d v1: ", T);
        std::printf("%.1f us\n", time_us([&] { g.run_v1(); }, iters));
        std::printf("  T=%d v2, 32-column slices: ", T);
        std::printf("%.1f us\n", time_us([&] { g.run_v2<32>(); }, iters));
        std::printf("  T=%d v2, 16-column slices: ", T);
        std::printf("%.1f us\n", time_us([&] { g.run_v2<16>(); }, iters));
        std::printf("  T=%d v3, 4 lanes a column: ", T);
        std::printf("%.1f us\n", time_us([&] { g.run_v3<4>(); }, iters));
        std::printf("  T=%d v3, 8 lanes a column: ", T);
        std::printf("%.1f us\n", time_us([&] { g.run_v3<8>(); }, iters));
        std::printf("  T=%d v3, 16 lanes a column: ", T);
        std::printf("%.1f us\n", time_us([&] { g.run_v3<16>(); }, iters));
    }
    std::printf("all checks passed\n");
    return 0;
}
