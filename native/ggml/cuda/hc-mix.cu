// CUDA kernels of the hyper-connection mix at decode, each one launch over its weights, whose
// first loads a CTA issues before it waits for the kernel before it (PDL), all of a lane's at once
// (the weights are a few MB: a kernel is one round trip of loads, not a loop of them).
// hc_down: clusters of S CTAs take ROWS rows of [w_down | w_inject] (hc n_embd wide) against
// every token, the cluster's CTAs splitting K, each a part of one stream: a CTA reads its part of
// x once from L2, keeps x g in shared memory and sums the squares of x beside it; a warp takes two
// rows, a lane 8-element chunks of both. The cluster's first CTA adds the CTAs' sums in rank order
// from their shared memory, each stream's RMS factor applied after the reduction (lo = sum over c
// of f[c] * (w . x g)[c]). Needs sm_90 (pyqsa_cuda_hc_mix_supported). Where a combine made x, its
// launch can be hc_down's (pyqsa_cuda_hc_combine_fuse): each CTA computes its part of x from the
// combine's inputs, and the first cluster stores it as the combine's result.
// hc_pre: a warp an embedding position, a lane chunks of its hc rows of w_up (lr wide) against
// the tokens' low-rank inputs in shared memory (each read once for the hc rows), then the
// sigmoid-gated mean over the streams.
// Weights of f16 or f32, or quantized (gemv-weights.cuh: each chunk of 8 dequantized in registers
// into f16) at one token, where the mix is fused (fused-ops.cpp).
#include "cluster-launch.cuh"
#include "gemv-weights.cuh"
#include "hc-combine.cuh"
#include "hc-mix.cuh"
#include "pyqsa-cuda.cuh"
#include "pyqsa-env.h"

#include <cooperative_groups.h>

#include <type_traits>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
#    define PYQSA_HC_CLUSTERS 1
#else
#    define PYQSA_HC_CLUSTERS 0
#endif

namespace {

constexpr int BLOCK      = 256;
constexpr int WARPS      = BLOCK / WARP_SIZE;
constexpr int ROWS       = 2 * WARPS;  // rows of hc_down a cluster: 21 clusters for Flash-Next's 320 + 4
constexpr int DOWN_LOADS = 5;          // chunks of each row a lane loads at once: Flash-Next's parts
                                       // of 1280 columns in one round
constexpr int PRE_LOADS = 2;           // the same for hc_pre: rows of 320 in one round
// CTAs a SM holds at once, for registers: hc_down's 168 CTAs (Flash-Next) in one wave on 132 SMs,
// hc_pre's 320 at one token (at more its sums would spill)
constexpr int DOWN_CTAS = 2;

constexpr int pre_ctas(int nt) {
    return nt == 1 ? 3 : 2;
}
constexpr int MAX_DYNAMIC_SMEM = 40 * 1024;  // hc_down's x g: under the 48 KB a launch has unasked

// the parts a stream's columns split into over a cluster of at most 8 CTAs
__host__ __device__ constexpr int parts_of(int hc) {
    return hc >= 4 ? 2 : 8 / hc;
}

template <typename W> struct pair_of;

template <> struct pair_of<half> {
    using type = half2;

    static __device__ float2 to_float2(half2 v) { return __half22float2(v); }
};

template <> struct pair_of<float> {
    using type = float2;

    static __device__ float2 to_float2(float2 v) { return v; }
};

// VEC consecutive elements of type T, loaded as one (16 or 32 bytes at VEC 8)
template <typename T, int VEC> struct alignas(VEC * sizeof(T)) vec_of {
    T v[VEC];
};

// VEC consecutive weights as VEC / 2 pairs
template <typename W, int VEC> struct chunk {
    struct alignas(VEC * sizeof(W)) raw {
        typename pair_of<W>::type p[VEC / 2];
    } v;

    // elements k .. k + VEC - 1 of a row
    __device__ void load(const char * row, int64_t k) { v = *(const raw *) (row + k * (int64_t) sizeof(W)); }

    __device__ float2 pair(int i) const { return pair_of<W>::to_float2(v.p[i]); }
};

// 8 quantized weights, as f16 pairs
template <ggml_type T> struct qchunk {
    uint4 v;

    __device__ void load(const char * row, int64_t k) { v = gemv_weights<T>::load(row, (int) k); }

    __device__ float2 pair(int i) const { return __half22float2(((const half2 *) &v)[i]); }
};

// the chunk of VEC weights of type T
template <ggml_type T, int VEC> struct chunk_of {
    static_assert(VEC == 8, "quantized weights come in chunks of 8");
    using type = qchunk<T>;
};

template <int VEC> struct chunk_of<GGML_TYPE_F16, VEC> {
    using type = chunk<half, VEC>;
};

template <int VEC> struct chunk_of<GGML_TYPE_F32, VEC> {
    using type = chunk<float, VEC>;
};

// acc[r] += w[r][i] . s over a chunk, s its VEC floats in shared memory; at VEC 8 s read as two
// 16-byte halves, half `first` first (a lane's: a warp's reads then fall on distinct banks). i is
// an unrolled loop's: w stays in registers.
template <int VEC, typename C, int R, int L>
__device__ __forceinline__ void add_chunk(float (&acc)[R], const C (&w)[R][L], int i, const float * s, int first) {
    if constexpr (VEC == 8) {
        const float4 a = *(const float4 *) (s + 4 * first), b = *(const float4 *) (s + 4 * (first ^ 1));
        const float4 lo = first ? b : a, hi = first ? a : b;  // selected, not indexed: registers
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float2 p0 = w[r][i].pair(0), p1 = w[r][i].pair(1), p2 = w[r][i].pair(2), p3 = w[r][i].pair(3);
            acc[r] += p0.x * lo.x + p0.y * lo.y + p1.x * lo.z + p1.y * lo.w + p2.x * hi.x + p2.y * hi.y +
                      p3.x * hi.z + p3.y * hi.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC / 2; ++k) {
            const float2 sv = *(const float2 *) (s + 2 * k);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float2 a = w[r][i].pair(k);
                acc[r] += a.x * sv.x + a.y * sv.y;
            }
        }
    }
}

// a lane's chunks j = base + lane + 32 i (i < L) of the R rows w[r] from element k0, those below n_ch
template <int VEC, typename C, int R, int L>
__device__ __forceinline__ void load_chunks(C (&wc)[R][L], const char * const (&w)[R], int64_t k0, int base, int n_ch,
                                            int lane) {
#pragma unroll
    for (int i = 0; i < L; ++i) {
        const int j = base + lane + WARP_SIZE * i;
        if (j < n_ch) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                wc[r][i].load(w[r], k0 + (int64_t) j * VEC);
            }
        }
    }
}

// acc[t][r] = the warp's sum of row w[r] from element k0 (n_ch chunks) times s + t * stride (NT
// rows of floats in shared memory), in rounds of L chunks a lane, the first round's loads
// (load_chunks at 0) issued by the caller
template <int VEC, typename C, int R, int L, int NT>
__device__ __forceinline__ void warp_dot_rows(float (&acc)[NT][R], C (&wc)[R][L], const char * const (&w)[R],
                                              int64_t k0, int n_ch, const float * s, int64_t stride, int lane) {
    const int first = (lane >> 2) & 1;
    for (int base = 0;;) {
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const int j = base + lane + WARP_SIZE * i;
            if (j < n_ch) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    add_chunk<VEC>(acc[t], wc, i, s + t * stride + j * VEC, first);
                }
            }
        }
        base += WARP_SIZE * L;
        if (base >= n_ch) {
            break;
        }
        load_chunks<VEC>(wc, w, k0, base, n_ch, lane);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[t][r] = warp_reduce_sum(acc[t][r]);
        }
    }
}

struct hc_down_args {
    float *       x;       // [n_embd, hc, NT], contiguous (with a combine, written by the first cluster)
    const float * w_norm;  // [n_embd, hc]
    const void *  w_down;  // [hc n_embd, lr]
    const void *  w_inject;
    size_t        w_nb1;  // the bytes of a row of either
    float *       dst;  // lo [lr, NT], inject [hc, NT], factor [hc, NT]
    int64_t       n_embd, hc, lr;
    int64_t       part;  // columns of a stream a CTA takes (the last CTA of a stream fewer)
    float         eps, scale;
    hc_combine_in comb;  // the combine that made x, where hc_down computes x itself
};

// a stream's part a CTA: n_embd over parts_of(hc), rounded up to whole chunks
int64_t part_of(int64_t n_embd, int64_t hc, int vec) {
    const int64_t p = parts_of((int) hc);
    return ((n_embd + p - 1) / p + vec - 1) / vec * vec;
}

template <ggml_type WT, int NT, int HC, int VEC>
__global__ void __launch_bounds__(BLOCK, DOWN_CTAS) hc_down(const hc_down_args a) {
#if PYQSA_HC_CLUSTERS
    constexpr int     P       = parts_of(HC);
    namespace cg              = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int         q = (int) cluster.block_rank(), c = q / P;
    const int         warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int64_t     k0   = (q % P) * a.part;
    const int         n_ch = (int) max((min(k0 + a.part, a.n_embd) - k0) / VEC, (int64_t) 0);
    const int64_t     n_rows = a.lr + HC, kw = c * a.n_embd + k0;  // the CTA's first element of a row
    const int64_t     row0   = (int64_t) (blockIdx.x / (HC * P)) * ROWS;

    using chunk_t = typename chunk_of<WT, VEC>::type;
    const char * w[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t row = min(row0 + 2 * warp + r, n_rows - 1);  // a repeat past the end
        w[r] = row < a.lr ? (const char *) a.w_down + row * a.w_nb1
                          : (const char *) a.w_inject + (row - a.lr) * a.w_nb1;
    }
    chunk_t wc[2][DOWN_LOADS];
    load_chunks<VEC>(wc, w, kw, 0, n_ch, lane);
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync();

    // this CTA's part of x g [NT][part], and each token's sum of squares of it
    extern __shared__ float xg[];
    __shared__ float        ss_warp[WARPS][NT];
    __shared__ float        ss[NT];
    __shared__ float        sums[ROWS][NT];  // the CTA's sums of its rows, read by the cluster's first
    {
        using fvec      = vec_of<float, VEC>;
        float ssq[NT]   = {};
        const float * g = a.w_norm + c * a.n_embd + k0;
        const bool    combine = a.comb.out != nullptr;
        const bool    writes  = combine && blockIdx.x < HC * P;  // the first cluster stores x
        for (int j = threadIdx.x; j < n_ch; j += BLOCK) {
            const fvec gv = ((const fvec *) g)[j];
            fvec       xv[NT];
            if (combine) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const int64_t e0 = k0 + (int64_t) j * VEC;
                    const float   in = a.comb.inject[c * a.comb.si0 + t * a.comb.si1];
#pragma unroll
                    for (int v = 0; v < VEC; ++v) {
                        xv[t].v[v] = hc_combine_element(hc_block_output(a.comb, e0 + v, t),
                                                        a.comb.residual[e0 + v + c * a.comb.sr1 + t * a.comb.sr2],
                                                        in, a.comb.scale);
                    }
                    if (writes) {
                        ((fvec *) (a.x + (t * HC + c) * a.n_embd + k0))[j] = xv[t];
                    }
                }
            } else {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    xv[t] = ((const fvec *) (a.x + (t * HC + c) * a.n_embd + k0))[j];
                }
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                fvec p;
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    ssq[t] += xv[t].v[v] * xv[t].v[v];
                    p.v[v] = xv[t].v[v] * gv.v[v];
                }
                ((fvec *) (xg + t * a.part))[j] = p;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float s = warp_reduce_sum(ssq[t]);
            if (lane == 0) {
                ss_warp[warp][t] = s;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        float s = 0.0f;
        for (int i = 0; i < WARPS; ++i) {
            s += ss_warp[i][threadIdx.x];
        }
        ss[threadIdx.x] = s;
    }

    float acc[NT][2] = {};
    warp_dot_rows<VEC>(acc, wc, w, kw, n_ch, xg, a.part, lane);
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                sums[2 * warp + r][t] = acc[t][r];
            }
        }
    }
    cluster.sync();

    if (q == 0) {
        __shared__ float factor[NT][HC];
        if (threadIdx.x < NT * HC) {
            const int t = threadIdx.x / HC, cc = threadIdx.x % HC;
            float     s = 0.0f;
            for (int p = 0; p < P; ++p) {
                s += cluster.map_shared_rank(ss, cc * P + p)[t];
            }
            factor[t][cc] = 1.0f / sqrtf(s / (float) a.n_embd + a.eps);
            if (blockIdx.x == 0) {
                a.dst[n_rows * NT + t * HC + cc] = factor[t][cc];
            }
        }
        __syncthreads();
        if (threadIdx.x < ROWS * NT) {
            const int     r = threadIdx.x / NT, t = threadIdx.x % NT;
            const int64_t row = row0 + r;
            if (row < n_rows) {
                float s = 0.0f;
                for (int cc = 0; cc < HC; ++cc) {
                    float d = 0.0f;
                    for (int p = 0; p < P; ++p) {
                        d += cluster.map_shared_rank(&sums[0][0], cc * P + p)[r * NT + t];
                    }
                    s += factor[t][cc] * d;
                }
                if (row < a.lr) {
                    const float v         = a.scale * s;
                    a.dst[t * a.lr + row] = v / (1.0f + expf(-v));
                } else {
                    a.dst[a.lr * NT + t * HC + (row - a.lr)] = s;
                }
            }
        }
    }
    cluster.sync();  // the others' shared memory stays until the first has read it
#else
    GGML_UNUSED(a);
    NO_DEVICE_CODE;
#endif
}

struct hc_pre_args {
    const float * x;       // [n_embd, hc, NT], contiguous
    const float * w_norm;  // [n_embd, hc]
    const void *  w_up;    // [lr, hc n_embd]
    size_t        w_nb1;
    const float * down;    // hc_down's: lo [lr, NT], inject [hc, NT], factor [hc, NT]
    float *       dst;     // [n_embd, NT], contiguous
    int64_t       n_embd, lr;
    float         scale;
};

template <ggml_type WT, int NT, int HC, int VEC>
__global__ void __launch_bounds__(BLOCK, pre_ctas(NT)) hc_pre(const hc_pre_args a) {
    using chunk_t   = typename chunk_of<WT, VEC>::type;
    const int     warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int64_t e    = (int64_t) blockIdx.x * WARPS + warp;
    const int     n_ch = (int) (a.lr / VEC);
    const char *  w[HC];
#pragma unroll
    for (int c = 0; c < HC; ++c) {
        w[c] = (const char *) a.w_up + (min(e, a.n_embd - 1) + c * a.n_embd) * a.w_nb1;  // a repeat past the end
    }
    chunk_t wc[HC][PRE_LOADS];
    load_chunks<VEC>(wc, w, 0, 0, n_ch, lane);
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync();

    extern __shared__ float lo[];  // [NT][lr]
    for (int64_t i = threadIdx.x; i < NT * a.lr; i += BLOCK) {
        lo[i] = a.down[i];
    }
    __syncthreads();
    if (e >= a.n_embd) {
        return;
    }
    float gate[NT][HC] = {};
    warp_dot_rows<VEC>(gate, wc, w, 0, n_ch, lo, a.lr, lane);
    if (lane < NT) {
        const int t   = lane;
        float     sum = 0.0f;
#pragma unroll
        for (int c = 0; c < HC; ++c) {
            float g = 0.0f;
#pragma unroll
            for (int u = 0; u < NT; ++u) {
                g = u == t ? gate[u][c] : g;  // registers, no local memory
            }
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

// launch(WT, NT, HC, VEC) with the weights' type, the tokens, the streams and the chunk's elements
// (8 where every chunk starts on 16 bytes of f16: n is the rows' length that chunks split, a
// multiple of 8) as compile-time values (std::integral_constant): the kernels' instance for a
// node; quantized weights at one token in chunks of 8 only (pyqsa_cuda_hc_mix_supported)
template <typename F> void with_kernel(const ggml_tensor * dst, int64_t n, F && launch) {
    const ggml_tensor * x    = dst->src[0];
    const ggml_type     type = dst->src[2]->type;
    with_instance<1, PYQSA_HC_MIX_MAX_STREAMS>(x->ne[1], [&](auto hc) {
        if (ggml_is_quantized(type)) {
            pyqsa_with_gemv_weights(type, [&](auto wt) {
                launch(wt, std::integral_constant<int, 1>{}, hc, std::integral_constant<int, 8>{});
            });
            return;
        }
        with_instance<1, PYQSA_HC_MIX_MAX_TOKENS>(x->ne[2], [&](auto nt) {
            const auto go = [&](auto vec) {
                type == GGML_TYPE_F16 ? launch(std::integral_constant<ggml_type, GGML_TYPE_F16>{}, nt, hc, vec) :
                                        launch(std::integral_constant<ggml_type, GGML_TYPE_F32>{}, nt, hc, vec);
            };
            n % 8 == 0 ? go(std::integral_constant<int, 8>{}) : go(std::integral_constant<int, 2>{});
        });
    });
}

}  // namespace

bool pyqsa_cuda_hc_mix_supported(const ggml_tensor * op) {
    const ggml_tensor * x = op->src[0];
    const ggml_tensor * w = op->src[2];  // w_down or w_up
    const int64_t       n_embd = x->ne[0], hc = x->ne[1], nt = x->ne[2];
    // quantized: a type the gemv reads, one token, chunks of 8, rows aligned for its loads
    const int  align   = pyqsa_gemv_block_of(w->type).align;
    const auto aligned = [&](const ggml_tensor * t) { return ((uintptr_t) t->data | t->nb[1]) % align == 0; };
    const bool quant   = ggml_is_quantized(w->type) && align > 0 && nt == 1 && n_embd % 8 == 0 && w->ne[0] % 8 == 0 &&
                       aligned(w) && (ggml_get_op_params_i32(op, 0) == PYQSA_GGML_OP_HC_PRE || aligned(op->src[3]));
    const bool shapes = nt <= PYQSA_HC_MIX_MAX_TOKENS && hc <= PYQSA_HC_MIX_MAX_STREAMS && n_embd % 2 == 0 &&
                        w->ne[0] % 2 == 0 && (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32 || quant);
    if (ggml_get_op_params_i32(op, 0) == PYQSA_GGML_OP_HC_PRE) {
        return shapes;
    }
    const int64_t xg_bytes = nt * part_of(n_embd, hc, n_embd % 8 == 0 ? 8 : 2) * (int64_t) sizeof(float);
    return shapes && xg_bytes <= MAX_DYNAMIC_SMEM &&
           pyqsa_cuda_clusters_on((const void *) hc_down<GGML_TYPE_F16, 1, 4, 8>);
}

namespace {

// hc_down for node dst, x computed from the combine `comb` where comb.out is set
void launch_down(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const hc_combine_in & comb) {
    const ggml_tensor * x = dst->src[0];
    GGML_ASSERT(ggml_is_contiguous(dst) && ggml_is_contiguous(x));
    const int64_t n_embd = x->ne[0], hc = x->ne[1], nt = x->ne[2], lr = dst->src[2]->ne[1];
    const int     vec    = n_embd % 8 == 0 ? 8 : 2;
    const hc_down_args a = {
        (float *) x->data,
        (const float *) dst->src[1]->data,
        dst->src[2]->data,
        dst->src[3]->data,
        dst->src[2]->nb[1],
        (float *) dst->data,
        n_embd,
        hc,
        lr,
        part_of(n_embd, hc, vec),
        ggml_get_op_params_f32(dst, 1),
        ggml_get_op_params_f32(dst, 2),
        comb,
    };
    const unsigned                       cluster = (unsigned) (hc * parts_of((int) hc));
    const unsigned                       blocks  = (unsigned) ((lr + hc + ROWS - 1) / ROWS) * cluster;
    const ggml_cuda_kernel_launch_params p(dim3(blocks), BLOCK, nt * a.part * sizeof(float), ctx.stream());
    with_kernel(dst, n_embd, [&](auto wt, auto nt, auto hc, auto vec) {
        constexpr ggml_type WT = decltype(wt)::value;
        pyqsa_cuda_cluster_launch(hc_down<WT, decltype(nt)::value, decltype(hc)::value, decltype(vec)::value>, p,
                                  cluster, a);
    });
}

}  // namespace

void pyqsa_cuda_hc_down(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    launch_down(ctx, dst, hc_combine_in{});
}

int pyqsa_cuda_hc_combine_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * comb = cgraph->nodes[i];
    if (i + 1 >= cgraph->n_nodes || pyqsa_env_switch_on("PYQSA_CUDA_HC_COMBINE_APART")) {
        return 0;
    }
    ggml_tensor * down = cgraph->nodes[i + 1];
    if (down->op != GGML_OP_PYQSA || ggml_get_op_params_i32(down, 0) != PYQSA_GGML_OP_HC_DOWN ||
        down->src[0] != comb || !pyqsa_cuda_hc_mix_supported(down)) {
        return 0;
    }
    // the other clusters read the combine's inputs while the first writes its result
    for (const ggml_tensor * in : comb->src) {
        if (pyqsa_cuda_bytes_overlap(in, comb)) {
            return 0;
        }
    }
    launch_down(ctx, down, pyqsa_cuda_hc_combine_in(comb));
    return 1;
}

void pyqsa_cuda_hc_pre(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const hc_pre_args a = {
        (const float *) x->data,
        (const float *) dst->src[1]->data,
        dst->src[2]->data,
        dst->src[2]->nb[1],
        (const float *) dst->src[3]->data,
        (float *) dst->data,
        x->ne[0],
        dst->src[2]->ne[0],
        ggml_get_op_params_f32(dst, 1),
    };
    const unsigned                       grid = (unsigned) ((a.n_embd + WARPS - 1) / WARPS);
    const ggml_cuda_kernel_launch_params p(grid, BLOCK, x->ne[2] * a.lr * sizeof(float), ctx.stream());
    with_kernel(dst, a.lr, [&](auto wt, auto nt, auto hc, auto vec) {
        constexpr ggml_type WT = decltype(wt)::value;
        ggml_cuda_kernel_launch(hc_pre<WT, decltype(nt)::value, decltype(hc)::value, decltype(vec)::value>, p, a);
    });
}
