// qsa_attn on tensor cores, for f16 K/V: prefill chunks and decode steps. One CTA per
// (KV head, query, split) computes all heads of the GQA group at once: the group's query rows
// (up to 16) are the M dimension of an m16n8k16 product, so even one query fills the tensor cores
// (qsa_attn's CUDA-core kernel gives a head a warp and reduces every dot product across lanes).
//
// f32 where the reference is f32: a query row is split into f16 hi + lo (q = hi + lo to about
// 2^-22 relative) and S = hi K^T + lo K^T, the K rows being exact f16; likewise each softmax weight
// p = p_hi + p_lo in O += P V. Products accumulate in f32, so scores and outputs carry f32-level
// rounding (compared with the CPU op in test-qsa-ops), at twice the products of a plain f16 kernel.
//
// Per tile of 32 list entries: the cells' K and V rows are gathered into shared memory by cp.async
// (two stages: the next tile's rows load while this one computes), 4 warps compute S [16 x 32]
// (8 cells each), 128 threads update each row's online softmax (max, sum) and write P, and each
// warp adds P V into its quarter of the output's D columns. The result is the partial
// (acc, max, sum) of qsa-attn-warp.cuh, merged across splits by its merge kernel.
#include "qsa-attn-mma.cuh"

#include "mma-ptx.cuh"
#include "pyqsa-ggml.h"
#include "qsa-attn-warp.cuh"

#include <cstdlib>
#include <cstring>

using namespace pyqsa_attn;
using namespace pyqsa_mma;

namespace {

constexpr int ROWS    = 16;   // M: query rows of a GQA group (zero-padded)
constexpr int TILE    = 32;   // list entries per step
constexpr int THREADS = 128;  // 4 warps
constexpr int P_LD    = 40;   // halves per row of P: 80-byte rows keep ldmatrix free of bank conflicts

// A row of D halves in shared memory is D / 8 chunks of 16 bytes; chunk c of row r lives at
// c ^ (r % 8), so the 8 rows one ldmatrix reads at one chunk fall in 8 different bank groups.
template <int D> __device__ __forceinline__ int swz(int r, int chunk) {
    return r * D + ((chunk ^ (r & 7)) << 3);
}

template <int D> struct layout {
    static constexpr size_t q     = 0;                                        // hi, lo: [ROWS][D] half
    static constexpr size_t kv    = q + 2 * ROWS * D * sizeof(half);          // [2 stages][K, V][TILE][D]
    static constexpr size_t p     = kv + 2 * 2 * TILE * D * sizeof(half);     // hi, lo: [ROWS][P_LD] half
    static constexpr size_t s     = p + 2 * ROWS * P_LD * sizeof(half);       // [ROWS][TILE + 1] float
    static constexpr size_t valid = s + ROWS * (TILE + 1) * sizeof(float);    // [2 stages][TILE] int
    static constexpr size_t stats = valid + 2 * TILE * sizeof(int);           // alpha, m, l: [ROWS] float
    static constexpr size_t bytes = stats + 3 * ROWS * sizeof(float);
};

// grid (H / group, n_q * ns, n_split), THREADS threads
template <int D>
__global__ void __launch_bounds__(THREADS) qsa_attn_mma(const args a) {
#if __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
    extern __shared__ __align__(16) char smem[];
    using L             = layout<D>;
    constexpr int CH    = D / 8;    // 16-byte chunks of a row
    constexpr int NT    = D / 32;   // n-tiles of 8 output columns per warp
    half *        q_hi  = (half *) (smem + L::q);
    half *        q_lo  = q_hi + ROWS * D;
    half *        kv    = (half *) (smem + L::kv);
    half *        p_hi  = (half *) (smem + L::p);
    half *        p_lo  = p_hi + ROWS * P_LD;
    float *       sc    = (float *) (smem + L::s);
    int *         valid = (int *) (smem + L::valid);
    float *       alpha = (float *) (smem + L::stats);
    float *       m_s   = alpha + ROWS;
    float *       l_s   = m_s + ROWS;

    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = lane / 4, t4 = lane % 4;  // fragment row and column pair
    const int hk = blockIdx.x, row = blockIdx.y, split = blockIdx.z;
    const int iq = row % a.n_q, s = row / a.n_q;

    // the group's query rows as f16 hi + lo, rows past the group zero
    for (int i = tid; i < ROWS * D; i += THREADS) {
        const int   r = i / D, d = i % D;
        const float x = r < a.group ? ((const float *) (a.q + (size_t) (hk * a.group + r) * a.q_nb1 +
                                                         (size_t) iq * a.q_nb2 + (size_t) s * a.q_nb3))[d]
                                    : 0.0f;
        const half  hi = __float2half_rn(x);
        q_hi[swz<D>(r, d / 8) + d % 8] = hi;
        q_lo[swz<D>(r, d / 8) + d % 8] = __float2half_rn(x - __half2float(hi));
    }

    const int32_t * list = a.cells + (size_t) row * a.n_sel;
    int             j0, j1;
    split_range(a, split, j0, j1);
    const int n_tiles = j1 > j0 ? (j1 - j0 + TILE - 1) / TILE : 0;

    // the K and V rows of list entries [jb, jb + TILE) into `stage`; entries past the range or -1
    // give zero rows, masked out of the scores
    const auto load = [&](int stage, int jb) {
        half * kt = kv + (size_t) stage * 2 * TILE * D;
        half * vt = kt + TILE * D;
        for (int i = tid; i < TILE * CH; i += THREADS) {
            const int cell = i / CH, ch = i % CH;
            const int c    = jb + cell < j1 ? list[jb + cell] : -1;
            const int o    = swz<D>(cell, ch);
            if (c >= 0) {
                const size_t k_at = (size_t) c * a.k_nb2 + (size_t) s * a.k_nb3 + (size_t) hk * a.k_nb1;
                const size_t v_at = (size_t) c * a.v_nb2 + (size_t) s * a.v_nb3 + (size_t) hk * a.v_nb1;
                cp_async_16(kt + o, a.k + k_at + ch * 16);
                cp_async_16(vt + o, a.v + v_at + ch * 16);
            } else {
                *(int4 *) (kt + o) = make_int4(0, 0, 0, 0);
                *(int4 *) (vt + o) = make_int4(0, 0, 0, 0);
            }
            if (ch == 0) {
                valid[stage * TILE + cell] = c >= 0;
            }
        }
    };

    float acc[NT][4] = {};
    // online softmax state of row tid / 8, held by its 8 threads alike
    const int sr = tid / 8, sq = tid % 8;
    float     m = -INFINITY, l = 0.0f;

    if (n_tiles > 0) {
        load(0, j0);
    }
    cp_async_commit();
    for (int t = 0; t < n_tiles; ++t) {
        if (t + 1 < n_tiles) {
            load((t + 1) & 1, j0 + (t + 1) * TILE);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const half * kt = kv + (size_t) (t & 1) * 2 * TILE * D;
        const half * vt = kt + TILE * D;
        const int *  ok = valid + (t & 1) * TILE;

        // S = Q K^T for cells warp*8 .. warp*8 + 7, two k-steps per ldmatrix of K
        float s4[4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 32; ++kk) {
            uint32_t b[4];
            const int cell = warp * 8 + lane % 8;
            ldmatrix_x4(b, kt + swz<D>(cell, kk * 4 + lane / 8));
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = lane % 16, ch = (kk * 2 + h2) * 2 + lane / 16;
                uint32_t  ah[4], al[4];
                ldmatrix_x4(ah, q_hi + swz<D>(r, ch));
                ldmatrix_x4(al, q_lo + swz<D>(r, ch));
                mma_f16(s4, ah, b[2 * h2], b[2 * h2 + 1]);
                mma_f16(s4, al, b[2 * h2], b[2 * h2 + 1]);
            }
        }
        {
            const int c0 = warp * 8 + 2 * t4;
            sc[g * (TILE + 1) + c0]           = ok[c0] ? s4[0] * a.scale : -INFINITY;
            sc[g * (TILE + 1) + c0 + 1]       = ok[c0 + 1] ? s4[1] * a.scale : -INFINITY;
            sc[(g + 8) * (TILE + 1) + c0]     = ok[c0] ? s4[2] * a.scale : -INFINITY;
            sc[(g + 8) * (TILE + 1) + c0 + 1] = ok[c0 + 1] ? s4[3] * a.scale : -INFINITY;
        }
        __syncthreads();

        // the online softmax: row sr's 32 scores, 4 per thread
        {
            float x[4], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                x[i] = sc[sr * (TILE + 1) + sq * 4 + i];
                mx   = fmaxf(mx, x[i]);
            }
#pragma unroll
            for (int o = 4; o > 0; o /= 2) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            }
            const float m_new = fmaxf(m, mx);
            const float rescale = m_new == -INFINITY ? 1.0f : expf(m - m_new);
            float       sum   = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float p  = x[i] == -INFINITY ? 0.0f : expf(x[i] - m_new);
                const half  hi = __float2half_rn(p);
                p_hi[sr * P_LD + sq * 4 + i] = hi;
                p_lo[sr * P_LD + sq * 4 + i] = __float2half_rn(p - __half2float(hi));
                sum += p;
            }
#pragma unroll
            for (int o = 4; o > 0; o /= 2) {
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            }
            l = l * rescale + sum;
            m = m_new;
            if (sq == 0) {
                alpha[sr] = rescale;
            }
        }
        __syncthreads();

        // O = O * alpha + P V over this warp's D / 4 columns
        const float a0 = alpha[g], a1 = alpha[g + 8];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[j][0] *= a0;
            acc[j][1] *= a0;
            acc[j][2] *= a1;
            acc[j][3] *= a1;
        }
#pragma unroll
        for (int ks = 0; ks < TILE / 16; ++ks) {
            uint32_t  ph[4], pl[4];
            const int r = lane % 16, col = ks * 16 + (lane / 16) * 8;
            ldmatrix_x4(ph, p_hi + r * P_LD + col);
            ldmatrix_x4(pl, p_lo + r * P_LD + col);
#pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp) {
                uint32_t  b[4];
                const int cell = ks * 16 + lane % 8 + ((lane / 8) & 1) * 8;
                ldmatrix_x4_trans(b, vt + swz<D>(cell, (warp * (D / 4) + jp * 16) / 8 + lane / 16));
                mma_f16(acc[2 * jp], ph, b[0], b[1]);
                mma_f16(acc[2 * jp], pl, b[0], b[1]);
                mma_f16(acc[2 * jp + 1], ph, b[2], b[3]);
                mma_f16(acc[2 * jp + 1], pl, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    if (sq == 0) {
        m_s[sr] = m;
        l_s[sr] = l;
    }
    __syncthreads();

    // rows g and g + 8 of this warp's columns: the output, or the split's partial for merge
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const int r = g + 8 * half_row;
        if (r >= a.group) {
            continue;
        }
        const int h = hk * a.group + r;
        float *   o;
        float     mul;
        if (a.n_split == 1) {
            o   = out_row(a, h, row);
            mul = l_s[r] > 0.0f ? 1.0f / l_s[r] : 0.0f;
        } else {
            o   = state_at<D / WARP>(a.out, a, h, row, split);
            mul = 1.0f;
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int d = warp * (D / 4) + j * 8 + 2 * t4;
            o[d]        = acc[j][2 * half_row] * mul;
            o[d + 1]    = acc[j][2 * half_row + 1] * mul;
        }
    }
    if (a.n_split > 1 && tid < a.group) {
        float * st = state_at<D / WARP>(a.out, a, hk * a.group + tid, row, split);
        st[D]      = m_s[tid];
        st[D + 1]  = l_s[tid];
    }
#else
    GGML_UNUSED(a);
    NO_DEVICE_CODE;
#endif
}

template <int D> void launch(ggml_backend_cuda_context & ctx, const args & a, int n_rows) {
    constexpr size_t bytes = layout<D>::bytes;
    static bool      raised[GGML_CUDA_MAX_DEVICES] = {};
    if (!raised[ctx.device]) {
        CUDA_CHECK(cudaFuncSetAttribute(qsa_attn_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes));
        raised[ctx.device] = true;
    }
    run_split<D / WARP>(ctx, a, n_rows, [&](const args & pa) {
        qsa_attn_mma<D><<<dim3(a.H / a.group, n_rows, a.n_split), THREADS, bytes, ctx.stream()>>>(pa);
        CUDA_CHECK(cudaGetLastError());
    });
}

}  // namespace

bool pyqsa_cuda_qsa_attn_mma(ggml_backend_cuda_context & ctx, const args & a, ggml_type kv_type, int D, int n_rows) {
    // PYQSA_QSA_ATTN_MMA=0 keeps every call on the CUDA-core kernel, the one qsa_attn_part's
    // passes reproduce bit for bit (for comparisons, and the paged-vs-unpaged tests of those passes)
    const char * env = std::getenv("PYQSA_QSA_ATTN_MMA");
    if (env != nullptr && std::strcmp(env, "0") == 0) {
        return false;
    }
    // NOTE: decode steps too: a GQA group's heads read each staged K/V tile once here, where the
    // CUDA-core kernel's warps each read it from shared memory (decode.py at 8 x 32K on an H100,
    // 9.24 ms a step against 9.77; native/dev/README.md, qsa-decode)
    if (kv_type != GGML_TYPE_F16 || a.group > ROWS || a.unit != 16 ||
        ggml_cuda_info().devices[ctx.device].cc < GGML_CUDA_CC_AMPERE) {
        return false;
    }
    switch (D) {
        case 64:  launch<64>(ctx, a, n_rows); return true;
        case 128: launch<128>(ctx, a, n_rows); return true;
        case 256: launch<256>(ctx, a, n_rows); return true;
        default:  return false;
    }
}
