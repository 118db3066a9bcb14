// CUDA kernels of the hyper-connection mix at decode, each one launch over the weights.
// hc_down: a CTA of 256 threads takes ROWS rows of [w_down | w_inject] (hc n_embd wide) against
// every token, stream by stream; each thread keeps its sums per stream, and the squares of the x
// it reads beside them, so the RMS factor applies after the block reduction (lo = sum over c of
// f[c] * (w . x g)[c]): no pass of its own over x. Every CTA reads x (from L2) as any gemv does.
// hc_pre: a warp an embedding position, its hc rows of w_up (lr wide) against the tokens'
// low-rank inputs in shared memory, then the sigmoid-gated mean over the streams.
#include "hc-mix.cuh"

#include <type_traits>

namespace {

constexpr int BLOCK = 256;
constexpr int ROWS  = 2;  // rows of hc_down a CTA: 162 CTAs for Flash-Next's 320 + 4

template <typename W> struct pair_of;

template <> struct pair_of<half> {
    using type = half2;

    static __device__ float2 load(const half * p, int64_t i2) { return __half22float2(((const half2 *) p)[i2]); }
};

template <> struct pair_of<float> {
    using type = float2;

    static __device__ float2 load(const float * p, int64_t i2) { return ((const float2 *) p)[i2]; }
};

struct hc_down_args {
    const float * x;       // [n_embd, hc, NT], contiguous
    const float * w_norm;  // [n_embd, hc]
    const void *  w_down;  // [hc n_embd, lr]
    const void *  w_inject;
    float *       dst;  // lo [lr, NT], inject [hc, NT], factor [hc, NT]
    int64_t       n_embd, hc, lr;
    float         eps, scale;
};

template <typename W, int NT, int HC> __global__ void __launch_bounds__(BLOCK) hc_down(const hc_down_args a) {
    ggml_cuda_pdl_lc();
    const int64_t width = a.n_embd * HC, n_rows = a.lr + HC;
    const W *     w[ROWS];
    for (int r = 0; r < ROWS; ++r) {
        const int64_t row = min((int64_t) blockIdx.x * ROWS + r, n_rows - 1);  // a repeat past the end
        w[r] = row < a.lr ? (const W *) a.w_down + row * width : (const W *) a.w_inject + (row - a.lr) * width;
    }
    float acc[ROWS][NT][HC] = {};
    float ss[NT][HC]        = {};
    ggml_cuda_pdl_sync();
    const int64_t half_embd = a.n_embd / 2;
#pragma unroll
    for (int c = 0; c < HC; ++c) {
        for (int64_t k2 = threadIdx.x; k2 < half_embd; k2 += BLOCK) {
            const float2 g = ((const float2 *) (a.w_norm + c * a.n_embd))[k2];
            float2       wv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                wv[r] = pair_of<W>::load(w[r], c * half_embd + k2);
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float2 xv = ((const float2 *) (a.x + (t * HC + c) * a.n_embd))[k2];
                ss[t][c] += xv.x * xv.x + xv.y * xv.y;
                const float gx = xv.x * g.x, gy = xv.y * g.y;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    acc[r][t][c] += wv[r].x * gx + wv[r].y * gy;
                }
            }
        }
    }
    // the block's sums: each warp's by shuffles, then the warps' in shared memory
    constexpr int    N     = (ROWS + 1) * NT * HC;
    constexpr int    WARPS = BLOCK / WARP_SIZE;
    __shared__ float part[WARPS][N];
    const int        warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int c = 0; c < HC; ++c) {
            const float s = warp_reduce_sum(ss[t][c]);
            if (lane == 0) part[warp][ROWS * NT * HC + t * HC + c] = s;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const float v = warp_reduce_sum(acc[r][t][c]);
                if (lane == 0) part[warp][(r * NT + t) * HC + c] = v;
            }
        }
    }
    __syncthreads();
    __shared__ float total[N];
    for (int i = threadIdx.x; i < N; i += BLOCK) {
        float s = 0.0f;
        for (int j = 0; j < WARPS; ++j) s += part[j][i];
        // past the rows' sums, each (token, stream)'s squares become its norm's factor
        total[i] = i < ROWS * NT * HC ? s : 1.0f / sqrtf(s / (float) a.n_embd + a.eps);
    }
    __syncthreads();
    if (threadIdx.x < ROWS * NT) {
        const int     r   = threadIdx.x / NT, t = threadIdx.x % NT;
        const int64_t row = (int64_t) blockIdx.x * ROWS + r;
        if (row < n_rows) {
            float s = 0.0f;
            for (int c = 0; c < HC; ++c) {
                s += total[ROWS * NT * HC + t * HC + c] * total[(r * NT + t) * HC + c];
            }
            if (row < a.lr) {
                const float v         = a.scale * s;
                a.dst[t * a.lr + row] = v / (1.0f + expf(-v));
            } else {
                a.dst[a.lr * NT + t * HC + (row - a.lr)] = s;
            }
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < NT * HC) {
        const int t = threadIdx.x / HC, c = threadIdx.x % HC;
        a.dst[n_rows * NT + t * HC + c] = total[ROWS * NT * HC + t * HC + c];
    }
}

struct hc_pre_args {
    const float * x;       // [n_embd, hc, NT], contiguous
    const float * w_norm;  // [n_embd, hc]
    const void *  w_up;    // [lr, hc n_embd]
    const float * down;    // hc_down's: lo [lr, NT], inject [hc, NT], factor [hc, NT]
    float *       dst;     // [n_embd, NT], contiguous
    int64_t       n_embd, lr;
    float         scale;
};

template <typename W, int NT, int HC> __global__ void __launch_bounds__(BLOCK) hc_pre(const hc_pre_args a) {
    ggml_cuda_pdl_lc();
    extern __shared__ float lo[];  // [NT][lr]
    ggml_cuda_pdl_sync();
    for (int64_t i = threadIdx.x; i < NT * a.lr; i += BLOCK) {
        lo[i] = a.down[i];
    }
    __syncthreads();
    const int64_t e = (int64_t) blockIdx.x * (BLOCK / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (e >= a.n_embd) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    float     gate[HC][NT] = {};
#pragma unroll
    for (int c = 0; c < HC; ++c) {
        const W * row = (const W *) a.w_up + (e + c * a.n_embd) * a.lr;
        for (int64_t k2 = lane; k2 < a.lr / 2; k2 += WARP_SIZE) {
            const float2 wv = pair_of<W>::load(row, k2);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float2 l = ((const float2 *) (lo + t * a.lr))[k2];
                gate[c][t] += wv.x * l.x + wv.y * l.y;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < HC; ++c) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            gate[c][t] = warp_reduce_sum(gate[c][t]);
        }
    }
    if (lane < NT) {
        const int t   = lane;
        float     sum = 0.0f;
#pragma unroll
        for (int c = 0; c < HC; ++c) {
            float g = 0.0f;
#pragma unroll
            for (int u = 0; u < NT; ++u) g = u == t ? gate[c][u] : g;  // registers, no local memory
            const float xn = (a.x[(t * HC + c) * a.n_embd + e] * a.down[(a.lr + HC) * NT + t * HC + c]) *
                             a.w_norm[c * a.n_embd + e];
            sum += xn * (1.0f / (1.0f + expf(-g)));
        }
        a.dst[t * a.n_embd + e] = a.scale * sum;
    }
}

// f(std::integral_constant<int, n>) for n in FIRST..LAST: the instance of a kernel for n
template <int FIRST, int LAST, typename F> void with_instance(int64_t n, F && f) {
    if constexpr (FIRST <= LAST) {
        if (n == FIRST) {
            f(std::integral_constant<int, FIRST>{});
        } else {
            with_instance<FIRST + 1, LAST>(n, f);
        }
    } else {
        GGML_ABORT("hc mix: %lld past the kernels' instances", (long long) n);
    }
}

// launch(W *, NT, HC) with the weight type (a null pointer of it), the tokens and the streams as
// compile-time values: the kernels' instance for a node
template <typename F> void with_kernel(const ggml_tensor * dst, F && launch) {
    const ggml_tensor * x   = dst->src[0];
    const bool          f16 = dst->src[2]->type == GGML_TYPE_F16;
    with_instance<1, PYQSA_HC_MIX_MAX_STREAMS>(x->ne[1], [&](auto hc) {
        with_instance<1, PYQSA_HC_MIX_MAX_TOKENS>(x->ne[2], [&](auto nt) {
            f16 ? launch(static_cast<half *>(nullptr), nt, hc) : launch(static_cast<float *>(nullptr), nt, hc);
        });
    });
}

}  // namespace

bool pyqsa_cuda_hc_mix_supported(const ggml_tensor * op) {
    const ggml_tensor * x = op->src[0];
    const ggml_tensor * w = op->src[2];  // w_down or w_up
    return x->ne[2] <= PYQSA_HC_MIX_MAX_TOKENS && x->ne[1] <= PYQSA_HC_MIX_MAX_STREAMS && x->ne[0] % 2 == 0 &&
           w->ne[0] % 2 == 0 && (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32);
}

void pyqsa_cuda_hc_down(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const hc_down_args a = {
        (const float *) x->data,
        (const float *) dst->src[1]->data,
        dst->src[2]->data,
        dst->src[3]->data,
        (float *) dst->data,
        x->ne[0],
        x->ne[1],
        dst->src[2]->ne[1],
        ggml_get_op_params_f32(dst, 1),
        ggml_get_op_params_f32(dst, 2),
    };
    const ggml_cuda_kernel_launch_params p(dim3((unsigned) ((a.lr + a.hc + ROWS - 1) / ROWS)), BLOCK, 0, ctx.stream());
    with_kernel(dst, [&](auto w, auto nt, auto hc) {
        using W = std::remove_pointer_t<decltype(w)>;
        ggml_cuda_kernel_launch(hc_down<W, decltype(nt)::value, decltype(hc)::value>, p, a);
    });
}

void pyqsa_cuda_hc_pre(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const hc_pre_args a = {
        (const float *) x->data,
        (const float *) dst->src[1]->data,
        dst->src[2]->data,
        (const float *) dst->src[3]->data,
        (float *) dst->data,
        x->ne[0],
        dst->src[2]->ne[0],
        ggml_get_op_params_f32(dst, 1),
    };
    const unsigned                       grid = (unsigned) ((a.n_embd + BLOCK / WARP_SIZE - 1) / (BLOCK / WARP_SIZE));
    const ggml_cuda_kernel_launch_params p(grid, BLOCK, x->ne[2] * a.lr * sizeof(float), ctx.stream());
    with_kernel(dst, [&](auto w, auto nt, auto hc) {
        using W = std::remove_pointer_t<decltype(w)>;
        ggml_cuda_kernel_launch(hc_pre<W, decltype(nt)::value, decltype(hc)::value>, p, a);
    });
}
