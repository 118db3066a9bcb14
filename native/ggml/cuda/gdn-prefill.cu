// See gdn-prefill.cuh. Per head h and sequence the state S [128 x 128] evolves token by token:
//   S_t = e^{g_t} S_{t-1} + k_t d_t^T,  d_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),  o_t = scale S_t^T q_t
// The columns of S are independent: a CTA of 256 threads takes 256 / LANES of them, a column on
// LANES lanes holding 128 / LANES rows each in registers. grid (H, 128 / COLS, n_seqs).
// At Flash-Next's shape (32 heads, 16 q/k heads, 2048 tokens) on the H200 a call took 900 us
// with 16 lanes a column against 1290 us for upstream's kernel (native/dev/README.md's
// gdn-chunked.cu study).
#include "gdn-prefill.cuh"

#include "ggml-cuda/common.cuh"
#include "mma-ptx.cuh"

#include <initializer_list>

using namespace pyqsa_mma;

namespace {

constexpr int SD      = 128;  // S_v = S_k
constexpr int THREADS = 256;

// one stage of staged inputs: TT tokens' q and k rows, the CTA's COLS columns of v, e^g and beta
template <int LANES, int TT> struct staged_inputs {
    static constexpr int COLS = THREADS / LANES;
    float q[2][TT][SD];
    float k[2][TT][SD];
    float v[2][TT][COLS];
    float o[TT][COLS];
    float e[2][TT];
    float beta[2][TT];
};

template <int LANES, int TT>
__global__ void __launch_bounds__(THREADS) gdn_prefill(const pyqsa_gdn_problem p) {
    using SM           = staged_inputs<LANES, TT>;
    constexpr int COLS = SM::COLS, RPL = SD / LANES;
    extern __shared__ __align__(16) char raw[];
    SM &          sm  = *(SM *) raw;
    const int     h = blockIdx.x, col0 = blockIdx.y * COLS, seq = blockIdx.z;
    const int     tid = threadIdx.x, cl = tid / LANES, sub = tid % LANES, col = col0 + cl;
    const float * qs  = p.q + (seq / p.rq3) * p.sq3 + (h % p.neqk1) * p.sq1;
    const float * ks  = p.k + (seq / p.rq3) * p.sq3 + (h % p.neqk1) * p.sq1;
    const float * vs  = p.v + seq * p.sv3 + h * p.sv1 + col0;
    const float * gs  = p.g + seq * p.sb3 + h * p.sb1;
    const float * bs  = p.beta + seq * p.sb3 + h * p.sb1;
    float *       os  = p.o + (seq * p.n_tokens * p.H + h) * SD + col0;
    const int64_t at_state = ((seq * p.H + h) * SD + col) * SD + sub * RPL;

    float s[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) s[r] = p.s0[at_state + r];

    const auto stage = [&](int buf, int tile) {
        const int t0 = tile * TT;
        for (int i = tid; i < TT * SD / 4; i += THREADS) {
            const int t = i / (SD / 4), c4 = i % (SD / 4);
            if (t0 + t < p.n_tokens) {
                cp_async_16(&sm.q[buf][t][c4 * 4], qs + (t0 + t) * p.sq2 + c4 * 4);
                cp_async_16(&sm.k[buf][t][c4 * 4], ks + (t0 + t) * p.sq2 + c4 * 4);
            }
        }
        for (int i = tid; i < TT * COLS / 4; i += THREADS) {
            const int t = i / (COLS / 4), c4 = i % (COLS / 4);
            if (t0 + t < p.n_tokens) cp_async_16(&sm.v[buf][t][c4 * 4], vs + (t0 + t) * p.sv2 + c4 * 4);
        }
        if (tid < TT) {
            const bool in     = t0 + tid < p.n_tokens;
            sm.e[buf][tid]    = in ? expf(gs[(t0 + tid) * p.sb2]) : 0.0f;
            sm.beta[buf][tid] = in ? bs[(t0 + tid) * p.sb2] : 0.0f;
        }
    };

    const int n_tiles = (int) ((p.n_tokens + TT - 1) / TT);
    stage(0, 0);
    cp_async_commit();
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int buf = tile & 1, n = (int) min((int64_t) TT, p.n_tokens - (int64_t) tile * TT);
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
            // four partial sums a lane: dependent chains of RPL / 4 FMAs
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
        for (int i = tid; i < n * COLS; i += THREADS) {
            const int t = i / COLS, c = i % COLS;
            os[((int64_t) tile * TT + t) * p.H * SD + c] = sm.o[t][c];
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < RPL; ++r) p.s1[at_state + r] = s[r];
}

template <int LANES, int TT> void launch(const pyqsa_gdn_problem & p, cudaStream_t stream) {
    using SM     = staged_inputs<LANES, TT>;
    static bool raised[GGML_CUDA_MAX_DEVICES] = {};
    const int   device                        = ggml_cuda_get_device();
    if (!raised[device]) {
        CUDA_CHECK(cudaFuncSetAttribute(gdn_prefill<LANES, TT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) sizeof(SM)));
        raised[device] = true;
    }
    gdn_prefill<LANES, TT><<<dim3(p.H, SD / SM::COLS, p.n_seqs), THREADS, sizeof(SM), stream>>>(p);
    CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void * ptr, std::initializer_list<int64_t> strides) {
    bool ok = ((uintptr_t) ptr % 16) == 0;
    for (const int64_t s : strides) ok = ok && s % 4 == 0;
    return ok;
}

}  // namespace

bool pyqsa_cuda_gdn_prefill(const pyqsa_gdn_problem & p, cudaStream_t stream) {
    if (!pyqsa_cuda_gdn_staged() || p.S_v != SD || p.n_tokens < PYQSA_GDN_PREFILL_MIN_TOKENS || p.n_seqs > 65535 ||
        !aligned16(p.q, { p.sq1, p.sq2, p.sq3 }) || !aligned16(p.k, { p.sq1, p.sq2, p.sq3 }) ||
        !aligned16(p.v, { p.sv1, p.sv2, p.sv3 })) {
        return false;
    }
    if (pyqsa_cuda_gdn_lanes() == 32) {
        launch<32, 16>(p, stream);
    } else {
        launch<16, 32>(p, stream);
    }
    return true;
}
