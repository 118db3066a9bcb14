// Prefill kernel for upstream's GGML_OP_GATED_DELTA_NET (scalar gate, no state snapshots): the
// same recurrence as upstream's gated_delta_net_cuda, with each chunk's inputs staged in shared
// memory ahead of use.
//
// Per (sequence, head) the state S [S_v x S_v] evolves token by token; column `col` of S (one
// output element) depends only on itself and the token's k, q, v[col], g, beta:
//   kv    = S[:, col] . k                      delta = (v[col] - exp(g) kv) beta
//   S[:, col] = exp(g) S[:, col] + k delta     out[col] = (S[:, col] . q) / sqrt(S_v)
// One warp owns a column (lane l holds rows l, l + 32, ...), as upstream's kernel does, and does
// the same arithmetic in the same order. Upstream's kernel reads each token's k, q, v, g and beta
// from global memory inside the token loop, so every step waits on those loads (1.27 ms a layer
// for a 2048-token chunk of Flash-Next, 22% of its prefill kernel time on the H200). Here the
// CTA's warps (columns of one head) copy the next TOKENS tokens' inputs to shared memory with
// cp.async while they compute on the current ones, so a step waits only on its two warp sums.
#include "gated-delta-net.cuh"

#include "mma-ptx.cuh"

#include <cstdlib>
#include <cstring>

using namespace pyqsa_mma;

namespace {

constexpr int WARP   = 32;
constexpr int COLS   = 4;   // warps (columns of S) per CTA
constexpr int TOKENS = 16;  // tokens a stage holds (two stages: 33 KiB of static shared memory)

struct gdn_args {
    const float * q;
    const float * k;
    const float * v;
    const float * g;
    const float * beta;
    const float * state_in;   // [S_v, S_v, H, n_seqs], column col of S at row col (transposed)
    float *       out;        // [S_v, H, n_tokens, n_seqs]
    float *       state_out;  // like state_in
    int64_t       sq1, sq2, sq3;  // q and k strides, in floats
    int64_t       sv1, sv2, sv3;
    int64_t       sb1, sb2, sb3;  // g and beta
    int           H, n_tokens, neqk1, rq3;
    float         scale;
};

__device__ __forceinline__ void cp_async_4(void * dst, const void * src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(smem_addr(dst)), "l"(src));
}

template <int S_v> struct stage {
    float k[TOKENS][S_v];
    float q[TOKENS][S_v];
    float v[TOKENS][COLS];
    float g[TOKENS];
    float beta[TOKENS];
};

// grid (H, n_seqs, S_v / COLS), block (WARP, COLS)
template <int S_v>
__global__ void __launch_bounds__(WARP * COLS) gdn_prefill(const gdn_args a) {
    constexpr int RPL = S_v / WARP;  // rows of S a lane holds
    __shared__ __align__(16) stage<S_v> st[2];  // cp.async writes 16-byte pieces

    const int h = blockIdx.x, seq = blockIdx.y, lane = threadIdx.x, warp = threadIdx.y;
    const int col0 = blockIdx.z * COLS, col = col0 + warp;
    const int tid  = warp * WARP + lane;
    const int iq1 = h % a.neqk1, iq3 = seq / a.rq3;

    const size_t qk_off = (size_t) (iq3 * a.sq3 + iq1 * a.sq1);
    const size_t v_off  = (size_t) (seq * a.sv3 + h * a.sv1 + col0);
    const size_t gb_off = (size_t) (seq * a.sb3 + h * a.sb1);

    // tokens [t0, t0 + TOKENS) into st[s]; tokens past n_tokens are not copied (never read)
    const auto load = [&](int s, int t0) {
        const int n = min(TOKENS, a.n_tokens - t0);
        for (int i = tid; i < n * (S_v / 4); i += WARP * COLS) {
            const int t = i / (S_v / 4), c = (i % (S_v / 4)) * 4;
            const size_t at = qk_off + (size_t) (t0 + t) * a.sq2 + c;
            cp_async_16(&st[s].k[t][c], a.k + at);
            cp_async_16(&st[s].q[t][c], a.q + at);
        }
        for (int t = tid; t < n; t += WARP * COLS) {
            cp_async_16(&st[s].v[t][0], a.v + v_off + (size_t) (t0 + t) * a.sv2);
            cp_async_4(&st[s].g[t], a.g + gb_off + (size_t) (t0 + t) * a.sb2);
            cp_async_4(&st[s].beta[t], a.beta + gb_off + (size_t) (t0 + t) * a.sb2);
        }
    };

    const size_t sh = ((size_t) seq * a.H + h) * S_v * S_v;  // this (sequence, head)'s state
    float        s_col[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        s_col[r] = a.state_in[sh + (size_t) col * S_v + r * WARP + lane];
    }
    float * out = a.out + ((size_t) seq * a.n_tokens * a.H + h) * S_v + col;

    const int n_chunks = (a.n_tokens + TOKENS - 1) / TOKENS;
    load(0, 0);
    cp_async_commit();
    for (int c = 0; c < n_chunks; ++c) {
        if (c + 1 < n_chunks) {
            load((c + 1) & 1, (c + 1) * TOKENS);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const stage<S_v> & cur = st[c & 1];
        const int          n   = min(TOKENS, a.n_tokens - c * TOKENS);
        for (int t = 0; t < n; ++t) {
            const float g_val    = expf(cur.g[t]);
            const float beta_val = cur.beta[t];
            float       k_reg[RPL], q_reg[RPL];
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                k_reg[r] = cur.k[t][r * WARP + lane];
                q_reg[r] = cur.q[t][r * WARP + lane];
            }
            float kv = 0.0f;
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                kv += s_col[r] * k_reg[r];
            }
            kv                = warp_reduce_sum(kv);
            const float delta = (cur.v[t][warp] - g_val * kv) * beta_val;
            float       attn  = 0.0f;
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                s_col[r] = g_val * s_col[r] + k_reg[r] * delta;
                attn += s_col[r] * q_reg[r];
            }
            attn = warp_reduce_sum(attn);
            if (lane == 0) {
                out[(size_t) (c * TOKENS + t) * S_v * a.H] = attn * a.scale;
            }
        }
        __syncthreads();  // the stage is free for chunk c + 2's copies
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        a.state_out[sh + (size_t) col * S_v + r * WARP + lane] = s_col[r];
    }
}

}  // namespace

bool pyqsa_cuda_gated_delta_net(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, float * state_out) {
    // PYQSA_GDN_PREFILL=0 keeps upstream's kernel (for comparisons)
    const char * env = std::getenv("PYQSA_GDN_PREFILL");
    if (env != nullptr && std::strcmp(env, "0") == 0) {
        return false;
    }
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * g = dst->src[3];
    const ggml_tensor * b = dst->src[4];
    const int64_t S_v = v->ne[0], n_tokens = v->ne[2];
    // strides of q, k and v in whole 16-byte units, so every staged row copies in 16-byte pieces
    const size_t align = (size_t) (uintptr_t) q->data | (size_t) (uintptr_t) k->data | (size_t) (uintptr_t) v->data |
                         q->nb[1] | q->nb[2] | q->nb[3] | v->nb[1] | v->nb[2] | v->nb[3];
    if (S_v != 128 || g->ne[0] != 1 || n_tokens < PYQSA_GDN_PREFILL_MIN_TOKENS || align % 16 != 0 ||
        v->ne[1] > 65535 || v->ne[3] > 65535 || ggml_cuda_info().devices[ctx.device].cc < GGML_CUDA_CC_AMPERE) {
        return false;
    }
    gdn_args a;
    a.q         = (const float *) q->data;
    a.k         = (const float *) k->data;
    a.v         = (const float *) v->data;
    a.g         = (const float *) g->data;
    a.beta      = (const float *) b->data;
    a.state_in  = (const float *) dst->src[5]->data;
    a.out       = (float *) dst->data;
    a.state_out = state_out;
    a.sq1 = q->nb[1] / sizeof(float);  a.sq2 = q->nb[2] / sizeof(float);  a.sq3 = q->nb[3] / sizeof(float);
    a.sv1 = v->nb[1] / sizeof(float);  a.sv2 = v->nb[2] / sizeof(float);  a.sv3 = v->nb[3] / sizeof(float);
    a.sb1 = b->nb[1] / sizeof(float);  a.sb2 = b->nb[2] / sizeof(float);  a.sb3 = b->nb[3] / sizeof(float);
    a.H        = (int) v->ne[1];
    a.n_tokens = (int) n_tokens;
    a.neqk1    = (int) q->ne[1];
    a.rq3      = (int) (v->ne[3] / q->ne[3]);
    a.scale    = 1.0f / sqrtf((float) S_v);
    const dim3 grid(a.H, (unsigned) v->ne[3], (unsigned) (S_v / COLS));
    gdn_prefill<128><<<grid, dim3(WARP, COLS), 0, ctx.stream()>>>(a);
    CUDA_CHECK(cudaGetLastError());
    return true;
}
