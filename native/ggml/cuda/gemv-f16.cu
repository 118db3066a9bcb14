// f16 weights times 1-8 f32 columns (see gemv-f16.cuh). One launch: grid (row blocks, experts),
// WARPS warps a CTA, R rows a warp. A MUL_MAT is the one-expert case whose columns are all of x.
#include "gemv-f16.cuh"

#include <cstdlib>
#include <cstring>

namespace {

constexpr int WARPS    = 8;
constexpr int MAX_IDS  = WARPS * WARP_SIZE * 4;  // expert slots (n_used * n_tok) a MoE call may have
constexpr int CHUNK    = 8;                      // halves of w a lane loads at once: 16 bytes

struct gemv_args {
    const char * w;  // F16 [K, N, n_expert]
    size_t       w_nb1, w_nb2;
    const char * x;  // F32: the column of pair (t, u) at x + t * x_nb2 + (u % x_ne1) * x_nb1
    size_t       x_nb1, x_nb2;
    int          x_ne1;
    char *       dst;  // F32: the column of pair (t, u) at dst + t * d_nb2 + u * d_nb1
    size_t       d_nb1, d_nb2;
    const char * ids;  // I32 [n_used, n_tok]; nullptr: a MUL_MAT, one expert, n_used = 1
    size_t       ids_nb0, ids_nb1;
    int          n_used, n_tok, K, N;
};

__device__ __forceinline__ void f16x8_to_f32(const uint4 v, float * f) {
    const half2 * h = (const half2 *) &v;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 p = __half22float2(h[i]);
        f[2 * i]       = p.x;
        f[2 * i + 1]   = p.y;
    }
}

// rows [row0, row0 + R) of one expert's w times the T columns of `pairs`; a column's sum: each
// lane's chunks in order, 8 products a chunk in order, then the warp's butterfly
template <int T, int R>
__device__ __forceinline__ void rows_times_cols(const gemv_args & a, const char * w, int row0, const int * pairs) {
    const int lane = threadIdx.x % WARP_SIZE;
    const float * x[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const int p = pairs[t];
        x[t] = (const float *) (a.x + (size_t) (p / a.n_used) * a.x_nb2 + (size_t) (p % a.n_used % a.x_ne1) * a.x_nb1);
    }
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            acc[r][t] = 0.0f;
        }
    }
    const int n_chunks = a.K / CHUNK;
#pragma unroll 2
    for (int c = lane; c < n_chunks; c += WARP_SIZE) {
        float wf[R][CHUNK];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            // rows past N read row N - 1 again (never written)
            const int    row = min(row0 + r, a.N - 1);
            const uint4 v    = __ldcs((const uint4 *) (w + (size_t) row * a.w_nb1) + c);
            f16x8_to_f32(v, wf[r]);
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float4 x0 = __ldg((const float4 *) (x[t] + c * CHUNK));
            const float4 x1 = __ldg((const float4 *) (x[t] + c * CHUNK) + 1);
            const float  xf[CHUNK] = { x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w };
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    acc[r][t] = fmaf(wf[r][i], xf[i], acc[r][t]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            acc[r][t] = warp_reduce_sum(acc[r][t]);
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const int p = pairs[t];
            float * d   = (float *) (a.dst + (size_t) (p / a.n_used) * a.d_nb2 + (size_t) (p % a.n_used) * a.d_nb1);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (row0 + r < a.N) {
                    d[row0 + r] = acc[r][t];
                }
            }
        }
    }
}

template <int R>
__device__ __forceinline__ void rows_times_n_cols(const gemv_args & a, const char * w, int row0, const int * pairs, int n) {
    switch (n) {
        case 1: rows_times_cols<1, R>(a, w, row0, pairs); break;
        case 2: rows_times_cols<2, R>(a, w, row0, pairs); break;
        case 3: rows_times_cols<3, R>(a, w, row0, pairs); break;
        case 4: rows_times_cols<4, R>(a, w, row0, pairs); break;
        case 5: rows_times_cols<5, R>(a, w, row0, pairs); break;
        case 6: rows_times_cols<6, R>(a, w, row0, pairs); break;
        case 7: rows_times_cols<7, R>(a, w, row0, pairs); break;
        default: rows_times_cols<8, R>(a, w, row0, pairs); break;
    }
}

// grid (ceil(N / (WARPS * R)), experts): a MUL_MAT's one, or a MoE call's slots n_used * n_tok,
// CTA y taking the y-th distinct expert of ids (in pair order) and every pair routed to it
template <int R>
__global__ void __launch_bounds__(WARPS * WARP_SIZE) gemv_f16(const gemv_args a) {
    __shared__ int pairs[MAX_IDS];  // the pairs (t * n_used + u) this CTA multiplies, in order
    __shared__ int expert_of[MAX_IDS];
    __shared__ int n_pairs, expert;
    const int      n_slots = a.n_used * a.n_tok;

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
            expert_of[p] = *(const int32_t *) (a.ids + (size_t) (p / a.n_used) * a.ids_nb1 +
                                               (size_t) (p % a.n_used) * a.ids_nb0);
        }
        __syncthreads();
        // a pair whose expert no earlier pair has marks its expert's first appearance
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
    const int row0 = (blockIdx.x * WARPS + threadIdx.x / WARP_SIZE) * R;
    if (expert < 0 || row0 >= a.N) {
        return;
    }
    const char * w = a.w + (size_t) expert * a.w_nb2;
    for (int c0 = 0; c0 < n_pairs; c0 += PYQSA_GEMV_MAX_COLS) {
        rows_times_n_cols<R>(a, w, row0, pairs + c0, min(PYQSA_GEMV_MAX_COLS, n_pairs - c0));
    }
}

bool gemv_on() {
    const char * v = getenv("PYQSA_CUDA_GEMV_UPSTREAM");
    return v == nullptr || *v == '\0' || strcmp(v, "0") == 0;
}

bool aligned16(const void * p, size_t a, size_t b) {
    return (((uintptr_t) p | a | b) % 16) == 0;
}

// the most rows a warp takes that still gives every SM two CTAs
int rows_per_warp(int64_t N, int64_t grid_y, int n_sm) {
    for (int r : { 4, 2 }) {
        if ((N + WARPS * r - 1) / (WARPS * r) * grid_y >= 2 * n_sm) {
            return r;
        }
    }
    return 1;
}

void launch(ggml_backend_cuda_context & ctx, const gemv_args & a, int grid_y) {
    const int r = rows_per_warp(a.N, grid_y, ggml_cuda_info().devices[ctx.device].nsm);
    const dim3 grid((a.N + WARPS * r - 1) / (WARPS * r), grid_y);
    switch (r) {
        case 4: gemv_f16<4><<<grid, WARPS * WARP_SIZE, 0, ctx.stream()>>>(a); break;
        case 2: gemv_f16<2><<<grid, WARPS * WARP_SIZE, 0, ctx.stream()>>>(a); break;
        default: gemv_f16<1><<<grid, WARPS * WARP_SIZE, 0, ctx.stream()>>>(a); break;
    }
    CUDA_CHECK(cudaGetLastError());
}

// the checks every call makes of w and x: f16 rows of 16-byte chunks, f32 columns, NVIDIA warps
bool takes(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, const ggml_tensor * dst) {
    return gemv_on() && w->type == GGML_TYPE_F16 && x->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32 &&
           GGML_CUDA_CC_IS_NVIDIA(ggml_cuda_info().devices[ctx.device].cc) && w->ne[0] % CHUNK == 0 &&
           w->ne[1] <= INT32_MAX && w->nb[0] == sizeof(half) && x->nb[0] == sizeof(float) &&
           dst->nb[0] == sizeof(float) && w->ne[3] == 1 && x->ne[3] == 1 && dst->ne[3] == 1 &&
           aligned16(w->data, w->nb[1], w->nb[2]) && aligned16(x->data, x->nb[1], x->nb[2]);
}

}  // namespace

bool pyqsa_cuda_gemv(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, ggml_tensor * dst) {
    const int64_t T = x->ne[1];
    if (!takes(ctx, w, x, dst) || T < 1 || T > PYQSA_GEMV_MAX_COLS || w->ne[2] != 1 || x->ne[2] != 1 ||
        x->ne[0] != w->ne[0] || dst->ne[0] != w->ne[1] || dst->ne[1] != T || dst->ne[2] != 1) {
        return false;
    }
    // T columns as one expert's pairs (t, 0): x column t at t * nb1, dst column t at t * nb1
    const gemv_args a = { (const char *) w->data, w->nb[1], w->nb[2], (const char *) x->data, 0, x->nb[1], 1,
                          (char *) dst->data, 0, dst->nb[1], nullptr, 0, 0, 1, (int) T, (int) w->ne[0],
                          (int) w->ne[1] };
    launch(ctx, a, 1);
    return true;
}

bool pyqsa_cuda_gemv_id(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * w   = dst->src[0];
    const ggml_tensor * x   = dst->src[1];
    const ggml_tensor * ids = dst->src[2];
    const int64_t n_used = ids->ne[0], n_tok = ids->ne[1];
    if (!takes(ctx, w, x, dst) || ids->type != GGML_TYPE_I32 || n_tok < 1 || n_tok > PYQSA_GEMV_MAX_COLS ||
        n_used * n_tok > MAX_IDS || x->ne[2] != n_tok || dst->ne[1] != n_used || dst->ne[2] != n_tok ||
        x->ne[0] != w->ne[0] || dst->ne[0] != w->ne[1]) {
        return false;
    }
    const gemv_args a = { (const char *) w->data, w->nb[1], w->nb[2], (const char *) x->data, x->nb[1], x->nb[2],
                          (int) x->ne[1], (char *) dst->data, dst->nb[1], dst->nb[2], (const char *) ids->data,
                          ids->nb[0], ids->nb[1], (int) n_used, (int) n_tok, (int) w->ne[0], (int) w->ne[1] };
    launch(ctx, a, (int) std::min<int64_t>(n_used * n_tok, w->ne[2]));
    return true;
}
