// f16 weights times one f32 column (see gemv-f16.cuh). One launch: grid (row blocks, n_used),
// WARPS warps a CTA, R rows a warp. A MUL_MAT is the case of one expert and one column.
#include "gemv-f16.cuh"

#include <cstdlib>
#include <cstring>

namespace {

constexpr int WARPS    = 8;
constexpr int CHUNK    = 8;  // halves of w a lane loads at once: 16 bytes
constexpr int PREFETCH = 4;  // chunks of each of its rows a lane prefetches before the PDL wait

struct gemv_args {
    const char * w;  // F16 [K, N, n_expert]
    size_t       w_nb1, w_nb2;
    const char * x;  // F32 [K, x_ne1]: column u reads row u % x_ne1
    size_t       x_nb1;
    int          x_ne1;
    char *       dst;  // F32 [N, n_used]
    size_t       d_nb1;
    const char * ids;  // I32 [n_used]; nullptr: a MUL_MAT (expert 0, n_used 1)
    size_t       ids_nb0;
    int          K, N;
};

// a row's sum: each lane's chunks in order, 8 products a chunk in order, then the warp's butterfly
template <int R>
__global__ void __launch_bounds__(WARPS * WARP_SIZE) gemv_f16(const gemv_args a) {
    const int u        = blockIdx.y;
    const int lane     = threadIdx.x % WARP_SIZE;
    const int row0     = (blockIdx.x * WARPS + threadIdx.x / WARP_SIZE) * R;
    const int n_chunks = a.K / CHUNK;
    if (row0 >= a.N) {
        return;
    }
    // rows past N read row N - 1 again (never written)
    size_t row_off[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        row_off[r] = (size_t) min(row0 + r, a.N - 1) * a.w_nb1;
    }
    if (a.ids == nullptr) {  // the weights do not depend on the kernels before: fetch ahead
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int i = 0; i < PREFETCH; ++i) {
                const int c = lane + i * WARP_SIZE;
                if (c < n_chunks) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + row_off[r] + (size_t) c * 16));
                }
            }
        }
    }
    ggml_cuda_pdl_sync();
    const int     expert = a.ids ? *(const int32_t *) (a.ids + (size_t) u * a.ids_nb0) : 0;
    const char *  w      = a.w + (size_t) expert * a.w_nb2;
    const float * x      = (const float *) (a.x + (size_t) (u % a.x_ne1) * a.x_nb1);

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = 0.0f;
    }
#pragma unroll 4
    for (int c = lane; c < n_chunks; c += WARP_SIZE) {
        uint4 v[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            v[r] = __ldcs((const uint4 *) (w + row_off[r]) + c);
        }
        const float4 x0        = __ldg((const float4 *) (x + c * CHUNK));
        const float4 x1        = __ldg((const float4 *) (x + c * CHUNK) + 1);
        const float  xf[CHUNK] = { x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w };
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const half2 * h = (const half2 *) &v[r];
#pragma unroll
            for (int i = 0; i < CHUNK / 2; ++i) {
                const float2 f = __half22float2(h[i]);
                acc[r]         = fmaf(f.x, xf[2 * i], acc[r]);
                acc[r]         = fmaf(f.y, xf[2 * i + 1], acc[r]);
            }
        }
    }
    ggml_cuda_pdl_lc();
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = warp_reduce_sum(acc[r]);
    }
    if (lane == 0) {
        float * d = (float *) (a.dst + (size_t) u * a.d_nb1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (row0 + r < a.N) {
                d[row0 + r] = acc[r];
            }
        }
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

void launch(ggml_backend_cuda_context & ctx, const gemv_args & a, int n_used) {
    const int                           r = rows_per_warp(a.N, n_used, ggml_cuda_info().devices[ctx.device].nsm);
    const ggml_cuda_kernel_launch_params p(dim3((a.N + WARPS * r - 1) / (WARPS * r), n_used), dim3(WARPS * WARP_SIZE),
                                           0, ctx.stream());
    switch (r) {
        case 4: ggml_cuda_kernel_launch(gemv_f16<4>, p, a); break;
        case 2: ggml_cuda_kernel_launch(gemv_f16<2>, p, a); break;
        default: ggml_cuda_kernel_launch(gemv_f16<1>, p, a); break;
    }
}

// the checks every call makes: f16 rows of 16-byte chunks, f32 x of one token, NVIDIA warps
bool takes(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, const ggml_tensor * dst) {
    return gemv_on() && w->type == GGML_TYPE_F16 && x->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32 &&
           GGML_CUDA_CC_IS_NVIDIA(ggml_cuda_info().devices[ctx.device].cc) && w->ne[0] % CHUNK == 0 &&
           w->ne[1] <= INT32_MAX && x->ne[0] == w->ne[0] && dst->ne[0] == w->ne[1] && w->nb[0] == sizeof(half) &&
           x->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float) && w->ne[3] == 1 && x->ne[3] == 1 &&
           dst->ne[3] == 1 && aligned16(w->data, w->nb[1], w->nb[2]) && aligned16(x->data, x->nb[1], 0);
}

}  // namespace

bool pyqsa_cuda_gemv(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, ggml_tensor * dst) {
    // NOTE: a warp a row reads a narrow matrix with too few warps in flight; upstream's CTA a row
    // was faster below two rows a warp (4096 x 2560: 12.5 us against 15.2; decode.py at one
    // sequence 8.7 ms a step against 10.0 with every MUL_MAT here), so those stay there
    if (!takes(ctx, w, x, dst) || w->ne[2] != 1 || x->ne[1] != 1 || x->ne[2] != 1 || dst->ne[1] != 1 ||
        dst->ne[2] != 1 || rows_per_warp(w->ne[1], 1, ggml_cuda_info().devices[ctx.device].nsm) < 2) {
        return false;
    }
    const gemv_args a = { (const char *) w->data, w->nb[1], 0,       (const char *) x->data, 0, 1,
                          (char *) dst->data,     0,        nullptr, 0,                      (int) w->ne[0],
                          (int) w->ne[1] };
    launch(ctx, a, 1);
    return true;
}

bool pyqsa_cuda_gemv_id(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * w      = dst->src[0];
    const ggml_tensor * x      = dst->src[1];
    const ggml_tensor * ids    = dst->src[2];
    const int64_t       n_used = ids->ne[0];
    if (!takes(ctx, w, x, dst) || ids->type != GGML_TYPE_I32 || ids->ne[1] != 1 || x->ne[2] != 1 ||
        dst->ne[1] != n_used || dst->ne[2] != 1 || n_used > 65535) {
        return false;
    }
    const gemv_args a = { (const char *) w->data, w->nb[1], w->nb[2], (const char *) x->data, x->nb[1],
                          (int) x->ne[1],         (char *) dst->data, dst->nb[1], (const char *) ids->data,
                          ids->nb[0],             (int) w->ne[0],     (int) w->ne[1] };
    launch(ctx, a, (int) n_used);
    return true;
}
