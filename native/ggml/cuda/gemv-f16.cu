// f16 or quantized weights (gemv-weights.cuh) times 1-8 f32 columns (see gemv-f16.cuh). One
// column: grid (row blocks, n_used), WARPS warps a CTA, R rows a warp, a MUL_MAT being the case
// of one expert. 2-8 columns: grid (blocks of 16 * RG rows times a cluster's CTAs, expert slots),
// the CTA's W warps (and the cluster's CTAs) splitting K, on tensor cores. Either grid's row
// blocks may span several products of the same x (parts): each part takes its own blocks (one
// column: a row's sum is the same whichever launch computes it).
#include "gemv-f16.cuh"

#include "cluster-launch.cuh"
#include "gemv-weights.cuh"
#include "mma-ptx.cuh"

#include <cooperative_groups.h>
#include <cstdio>
#include <iterator>

namespace {

constexpr int WARPS    = 8;
constexpr int CHUNK    = 8;  // halves of w a lane loads at once: 16 bytes
constexpr int PREFETCH = 4;  // chunks of each of its rows a lane prefetches before the PDL wait

// one product of a launch: its weights, its result, and the first row block of the grid it takes
struct gemv_part {
    const char * w;  // [K, N, n_expert] of the launch's type
    size_t       w_nb1;
    char *       dst;  // F32: the column of pair (t, u) at dst + t * d_nb2 + u * d_nb1
    size_t       d_nb1, d_nb2;
    int          N;
    int          block0;
};

// the part of row block b, copied out field by field: indexing the kernel's parameters by a
// run-time value would copy them all to local memory
__device__ __forceinline__ gemv_part part_of(const gemv_part (&parts)[PYQSA_GEMV_MAX_PARTS], int n_parts, int b) {
    gemv_part p = parts[0];
#pragma unroll
    for (int i = 1; i < PYQSA_GEMV_MAX_PARTS; ++i) {
        if (i < n_parts && b >= parts[i].block0) {
            p = parts[i];
        }
    }
    return p;
}

struct gemv_args {
    gemv_part    parts[PYQSA_GEMV_MAX_PARTS];
    int          n_parts;
    size_t       w_nb2;
    const char * x;  // F32 [K, x_ne1]: column u reads row u % x_ne1
    size_t       x_nb1;
    int          x_ne1;
    const char * ids;  // I32 [n_used]; nullptr: MUL_MATs (expert 0, n_used 1)
    size_t       ids_nb0;
    int          K;
};

// a row's sum: each lane's chunks in order, 8 products a chunk in order, then the warp's butterfly.
// P = 4 (q6_K's load_step; launch() says why no other type): lane-step s takes chunks
// c = 4 P (s / 4) + s % 4, c + 4, .. c + 4 (P - 1), 32 weights apart, in that order
template <ggml_type T, int R, int P>
__global__ void __launch_bounds__(WARPS * WARP_SIZE) gemv_one(const gemv_args a) {
    using weights = gemv_weights<T>;
    const int       u        = blockIdx.y;
    const int       lane     = threadIdx.x % WARP_SIZE;
    const gemv_part pt       = part_of(a.parts, a.n_parts, blockIdx.x);
    const int       row0     = ((blockIdx.x - pt.block0) * WARPS + threadIdx.x / WARP_SIZE) * R;
    const int       n_chunks = a.K / CHUNK;
    if (row0 >= pt.N) {
        return;
    }
    // rows past N read row N - 1 again (never written)
    size_t row_off[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        row_off[r] = (size_t) min(row0 + r, pt.N - 1) * pt.w_nb1;
    }
    if (a.ids == nullptr) {  // the weights do not depend on the kernels before: fetch ahead
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int i = 0; i < PREFETCH; ++i) {
                const int c = lane + i * WARP_SIZE;
                if (c < n_chunks) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(pt.w + row_off[r] + weights::offset(c * CHUNK)));
                }
            }
        }
    }
    ggml_cuda_pdl_sync();
    const int     expert = a.ids ? *(const int32_t *) (a.ids + (size_t) u * a.ids_nb0) : 0;
    const char *  w      = pt.w + (size_t) expert * a.w_nb2;
    const float * x      = (const float *) (a.x + (size_t) (u % a.x_ne1) * a.x_nb1);

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = 0.0f;
    }
#pragma unroll 4
    for (int s = lane; s < n_chunks / P; s += WARP_SIZE) {
        const int c = s / 4 * 4 * P + s % 4;
        uint4     v[R][P];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if constexpr (P > 1) {
                weights::load_step(w + row_off[r], c * CHUNK, v[r]);
            } else {
                v[r][0] = weights::load(w + row_off[r], c * CHUNK);
            }
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const float * xc        = x + (c + 4 * p) * CHUNK;
            const float4  x0        = __ldg((const float4 *) xc);
            const float4  x1        = __ldg((const float4 *) xc + 1);
            const float   xf[CHUNK] = { x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w };
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const half2 * h = (const half2 *) &v[r][p];
#pragma unroll
                for (int i = 0; i < CHUNK / 2; ++i) {
                    const float2 f = __half22float2(h[i]);
                    acc[r]         = fmaf(f.x, xf[2 * i], acc[r]);
                    acc[r]         = fmaf(f.y, xf[2 * i + 1], acc[r]);
                }
            }
        }
    }
    ggml_cuda_pdl_lc();
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = warp_reduce_sum(acc[r]);
    }
    if (lane == 0) {
        float * d = (float *) (pt.dst + (size_t) u * pt.d_nb1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (row0 + r < pt.N) {
                d[row0 + r] = acc[r];
            }
        }
    }
}

// ---- 2-8 columns: m16n8k16 products, rows as A, the columns as B's 8 ----

constexpr int KB        = 32;   // k of a lane-step: 8 halves for each lane of a quad
constexpr int MAX_SLOTS = 256;  // n_used * n_tok of a MoE call

// gemv_args's, and the tokens: x's column of pair (t, u) at x + t * x_nb2 + (u % x_ne1) * x_nb1,
// ids I32 [n_used, n_tok]
struct cols_args : gemv_args {
    size_t x_nb2;
    size_t ids_nb1;
    int    n_used, n_tok;
};

// K split over a thread-block cluster needs sm_90's distributed shared memory; elsewhere the
// split kernels are never launched (pyqsa_cuda_clusters_on)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
#    define PYQSA_GEMV_CLUSTERS 1
#else
#    define PYQSA_GEMV_CLUSTERS 0
#endif

// NOTE: A's and B's k are permuted alike, which leaves each product's sum as it is: lane (g, t)
// loads the 8 halves k0 + 8t .. + 7 of its rows and of column g in one 16-byte (x: 32-byte) load,
// and the first product takes halves 0-3 as its k 2t, 2t + 1, 2t + 8, 2t + 9, the second 4-7.
// x is rounded to f16, as MMF and the CPU backend round it. P = gemv_step_chunks (2, 4: load_step):
// a lane-step also takes the 8 halves 32, 64, 96 further, from the same loads (q4_K's other
// nibbles), and their x, in two more products each: 32 P of K a step.
// W warps a CTA, 16 RG rows a CTA; SPLIT: K in equal shares over the CTAs of each cluster
// (grid x: row blocks times the cluster's size), the cluster's first CTA adding their sums in
// rank order
template <ggml_type T, int W, int RG, bool SPLIT, int P>
__global__ void __launch_bounds__(W * WARP_SIZE) gemv_cols(const cols_args a) {
    using weights = gemv_weights<T>;
    __shared__ int   pairs[MAX_SLOTS];  // the pairs (t * n_used + u) this CTA multiplies, in order
    __shared__ int   expert_of[MAX_SLOTS];
    __shared__ int   n_pairs, expert;
    __shared__ float partial[W][RG * 16][8];
    __shared__ float cta_sum[SPLIT ? RG * 16 * 8 : 1];  // a split CTA's share, read by the first
#if PYQSA_GEMV_CLUSTERS
    namespace cg      = cooperative_groups;
    const int S       = SPLIT ? (int) cg::this_cluster().num_blocks() : 1;
    const int rank    = SPLIT ? (int) cg::this_cluster().block_rank() : 0;
#else
    const int S = 1, rank = 0;
#endif
    const int        lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int        g = lane / 4, t = lane % 4;
    const int        block   = blockIdx.x / S;
    const gemv_part  pt      = part_of(a.parts, a.n_parts, block);
    const int        row0    = (block - pt.block0) * RG * 16;
    const int        n_slots = a.n_used * a.n_tok;
    const int        kbeg = a.K / S * rank, kend = kbeg + a.K / S;

    size_t row_off[RG][2];
#pragma unroll
    for (int i = 0; i < RG; ++i) {
        row_off[i][0] = (size_t) min(row0 + 16 * i + g, pt.N - 1) * pt.w_nb1;
        row_off[i][1] = (size_t) min(row0 + 16 * i + g + 8, pt.N - 1) * pt.w_nb1;
    }
    if (a.ids == nullptr) {  // the weights do not depend on the kernels before: fetch ahead
#pragma unroll
        for (int i = 0; i < RG; ++i) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const size_t at = row_off[i][j] + weights::offset(kbeg + warp * KB + t * 8);
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pt.w + at));
            }
        }
    }
    ggml_cuda_pdl_sync();
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
        if (warp == 0) {  // the blockIdx.y-th first appearance, then its expert's pairs in order, 32 a ballot
            int e = -1;
            for (int p0 = 0, seen = 0; p0 < n_slots && e < 0; p0 += WARP_SIZE) {
                const unsigned firsts = __ballot_sync(~0u, p0 + lane < n_slots && pairs[p0 + lane]);
                const int      want   = (int) blockIdx.y - seen;
                if (want < __popc(firsts)) {
                    unsigned rest = firsts;
                    for (int i = 0; i < want; ++i) {
                        rest &= rest - 1;
                    }
                    e = expert_of[p0 + __ffs(rest) - 1];
                }
                seen += __popc(firsts);
            }
            // every lane has read the flags (the ballots) before pairs[] takes the pairs
            int n = 0;
            for (int p0 = 0; p0 < n_slots && e >= 0; p0 += WARP_SIZE) {
                const bool     mine = p0 + lane < n_slots && expert_of[p0 + lane] == e;
                const unsigned m    = __ballot_sync(~0u, mine);
                if (mine) {
                    pairs[n + __popc(m & ((1u << lane) - 1))] = p0 + lane;
                }
                n += __popc(m);
            }
            if (lane == 0) {
                expert  = e;
                n_pairs = n;
            }
        }
    }
    __syncthreads();
    if (expert < 0) {  // the same for the whole grid row, so for a cluster's CTAs too
        return;
    }
    const char * w = pt.w + (size_t) expert * a.w_nb2;
    for (int c0 = 0; c0 < n_pairs; c0 += 8) {
        const int     nc = min(8, n_pairs - c0);
        const float * x  = nullptr;  // column g's, none past the CTA's columns
        if (g < nc) {
            const int p = pairs[c0 + g];
            x = (const float *) (a.x + (size_t) (p / a.n_used) * a.x_nb2 + (size_t) (p % a.n_used % a.x_ne1) * a.x_nb1);
        }
        float d[RG][4] = {};
#pragma unroll 4
        for (int k0 = kbeg + warp * KB * P; k0 < kend; k0 += W * KB * P) {
            const int k = k0 + t * 8;
            uint4     wv[RG][2][P];
#pragma unroll
            for (int i = 0; i < RG; ++i) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    if constexpr (P > 1) {
                        weights::load_step(w + row_off[i][j], k, wv[i][j]);
                    } else {
                        wv[i][j][0] = weights::load(w + row_off[i][j], k);
                    }
                }
            }
            uint32_t b[P][4] = {};
            if (x != nullptr) {
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const float4 x0   = __ldg((const float4 *) (x + k + KB * p));
                    const float4 x1   = __ldg((const float4 *) (x + k + KB * p) + 1);
                    const half2  h[4] = { __floats2half2_rn(x0.x, x0.y), __floats2half2_rn(x0.z, x0.w),
                                          __floats2half2_rn(x1.x, x1.y), __floats2half2_rn(x1.z, x1.w) };
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        b[p][i] = *(const uint32_t *) &h[i];
                    }
                }
            }
#pragma unroll
            for (int p = 0; p < P; ++p) {
#pragma unroll
                for (int i = 0; i < RG; ++i) {
                    const uint4 (&v)[2][P] = wv[i];
                    const uint32_t a0[4]   = { v[0][p].x, v[1][p].x, v[0][p].y, v[1][p].y };
                    const uint32_t a1[4]   = { v[0][p].z, v[1][p].z, v[0][p].w, v[1][p].w };
                    pyqsa_mma::mma_f16(d[i], a0, b[p][0], b[p][1]);
                    pyqsa_mma::mma_f16(d[i], a1, b[p][2], b[p][3]);
                }
            }
        }
        // d[i]: rows 16 i + g (0, 1) and + 8 (2, 3), columns 2t and 2t + 1; the warps' K shares
        // summed in warp order, then (split) the CTAs' in rank order
#pragma unroll
        for (int i = 0; i < RG; ++i) {
            partial[warp][16 * i + g][2 * t]         = d[i][0];
            partial[warp][16 * i + g][2 * t + 1]     = d[i][1];
            partial[warp][16 * i + g + 8][2 * t]     = d[i][2];
            partial[warp][16 * i + g + 8][2 * t + 1] = d[i][3];
        }
        __syncthreads();
        for (int o = threadIdx.x; o < RG * 16 * 8; o += blockDim.x) {
            const int r = o / 8, c = o % 8;
            float     sum = 0.0f;
#pragma unroll
            for (int v = 0; v < W; ++v) {
                sum += partial[v][r][c];
            }
            if constexpr (SPLIT) {
                cta_sum[o] = sum;
            } else if (c < nc && row0 + r < pt.N) {
                const int p = pairs[c0 + c];
                float *   y = (float *) (pt.dst + (size_t) (p / a.n_used) * pt.d_nb2 + (size_t) (p % a.n_used) * pt.d_nb1);
                y[row0 + r] = sum;
            }
        }
#if PYQSA_GEMV_CLUSTERS
        if constexpr (SPLIT) {
            cg::cluster_group cluster = cg::this_cluster();
            cluster.sync();
            if (rank == 0) {
                for (int o = threadIdx.x; o < RG * 16 * 8; o += blockDim.x) {
                    const int r = o / 8, c = o % 8;
                    if (c < nc && row0 + r < pt.N) {
                        float sum = 0.0f;
                        for (int q = 0; q < S; ++q) {
                            sum += cluster.map_shared_rank(cta_sum, q)[o];
                        }
                        const int p = pairs[c0 + c];
                        float *   y = (float *) (pt.dst + (size_t) (p / a.n_used) * pt.d_nb2 +
                                                 (size_t) (p % a.n_used) * pt.d_nb1);
                        y[row0 + r] = sum;
                    }
                }
            }
            cluster.sync();  // no CTA leaves or writes cta_sum again before the first has read it
        }
#endif
        __syncthreads();
    }
    ggml_cuda_pdl_lc();
}

// numbers the parts' row blocks of `rows` rows each in order; returns how many there are
template <typename Args> int number_blocks(Args & a, int rows) {
    int n = 0;
    for (int i = 0; i < a.n_parts; ++i) {
        a.parts[i].block0 = n;
        n += (a.parts[i].N + rows - 1) / rows;
    }
    return n;
}

// a 2-8 column launch's form: W warps a CTA, 16 RG rows a CTA, K split over S CTAs
struct cols_form {
    int W, RG, S;
};

// NOTE: about 20 warps a SM (native/dev/README.md, the cols-gemv study: every shape of an 8-
// sequence step of both MoE sizes, H100 and H200). A grid of more gets fewer warps a CTA (dense:
// 4; a MoE's, whose every CTA first finds its expert's pairs: 4, then 32 rows, then 2 warps, then
// 64 rows); a dense grid of fewer than half that splits K over a cluster of 2, 4 or 8 CTAs while
// each CTA keeps 512 or more of K (the hyper-connection norm's down product, 21 row blocks of K
// 10240, 3.9x faster in clusters of 8). `a` is a copy: counting a form's blocks numbers the parts.
// `step`: the K of a warp's lane-step, which each CTA's share of K must be a multiple of.
cols_form cols_form_of(cols_args a, int grid_y, int n_sm, bool clusters, int step) {
    const long target = 20L * n_sm;
    const bool moe    = a.ids != nullptr;
    const auto warps  = [&](const cols_form & f) { return (long) number_blocks(a, 16 * f.RG) * grid_y * f.W * f.S; };
    const cols_form fewer[] = { { 4, 1, 1 }, { 4, 2, 1 }, { 2, 2, 1 }, { 2, 4, 1 } };
    cols_form       f       = { 8, 1, 1 };
    for (int i = 0; i < (moe ? 4 : 1) && warps(f) > target; ++i) {
        f = fewer[i];
    }
    while (clusters && !moe && f.S < 8 && 2 * warps(f) < target && a.K % (2 * f.S * step) == 0 &&
           a.K / (2 * f.S) >= 512) {
        f.S *= 2;
    }
    return f;
}

template <ggml_type T, int P, int W, int RG, bool SPLIT>
void launch_form(ggml_backend_cuda_context & ctx, cols_args & a, int grid_y, int S) {
    const ggml_cuda_kernel_launch_params p(dim3(number_blocks(a, 16 * RG) * S, grid_y), dim3(W * WARP_SIZE), 0,
                                           ctx.stream());
    if constexpr (!SPLIT) {
        ggml_cuda_kernel_launch(gemv_cols<T, W, RG, false, P>, p, a);
    } else {
        pyqsa_cuda_cluster_launch(gemv_cols<T, W, RG, true, P>, p, (unsigned) S, a);
    }
}

// the forms a launch can take without a split (W, RG): cols_form_of's and two more only
// PYQSA_CUDA_GEMV_FORM picks (8 warps of 32 rows, 4 of 64)
constexpr cols_form cols_forms[] = { { 8, 1, 1 }, { 8, 2, 1 }, { 4, 1, 1 }, { 4, 2, 1 }, { 4, 4, 1 }, { 2, 2, 1 }, { 2, 4, 1 } };

// PYQSA_CUDA_GEMV_FORM="W,RG": one of cols_forms, forced for every 2-8 column launch (read at
// every call, so that test-products checks and times each form in one process); else W = 0
cols_form forced_cols_form() {
    const char * v = getenv("PYQSA_CUDA_GEMV_FORM");
    int          W = 0, RG = 0;
    if (v != nullptr && std::sscanf(v, "%d,%d", &W, &RG) == 2) {
        for (const cols_form & f : cols_forms) {
            if (f.W == W && f.RG == RG) {
                return f;
            }
        }
    }
    return { 0, 0, 0 };
}

template <ggml_type T, int P> void launch_in_form(ggml_backend_cuda_context & ctx, cols_args & a, int grid_y, cols_form f) {
    if (f.S > 1) {
        launch_form<T, P, 8, 1, true>(ctx, a, grid_y, f.S);
        return;
    }
    static_assert(std::size(cols_forms) == 7, "a launch_form below for each form");
    constexpr int P4 = P < 2 ? P : 2;  // 64 rows a CTA: 4 chunks a lane-step would spill (q6_K)
    switch (f.W * 8 + f.RG) {
        case 8 * 8 + 1: launch_form<T, P, 8, 1, false>(ctx, a, grid_y, 1); break;
        case 8 * 8 + 2: launch_form<T, P, 8, 2, false>(ctx, a, grid_y, 1); break;
        case 4 * 8 + 1: launch_form<T, P, 4, 1, false>(ctx, a, grid_y, 1); break;
        case 4 * 8 + 2: launch_form<T, P, 4, 2, false>(ctx, a, grid_y, 1); break;
        case 4 * 8 + 4: launch_form<T, P4, 4, 4, false>(ctx, a, grid_y, 1); break;
        case 2 * 8 + 2: launch_form<T, P, 2, 2, false>(ctx, a, grid_y, 1); break;
        default: launch_form<T, P4, 2, 4, false>(ctx, a, grid_y, 1); break;
    }
}

// the chunks a lane-step a launch takes: the type's (gemv_step_chunks) but where one is forced,
// halved while the lane-steps of `lanes` lanes would cover more than K
template <ggml_type T> int step_chunks(int K, int lanes) {
    int P = pyqsa_cuda_gemv_steps() ? gemv_step_chunks<T>::value : 1;
    while (P > 1 && K < lanes * CHUNK * P) {
        P /= 2;
    }
    return P;
}

// F(std::integral_constant<int, P>) for P = 1, 2 or 4 where the type's loader takes that many
template <ggml_type T, typename F> void with_step_chunks(int P, F && f) {
    constexpr int most = gemv_step_chunks<T>::value;
    if constexpr (most >= 4) {
        if (P == 4) {
            return f(std::integral_constant<int, 4>{});
        }
    }
    if constexpr (most >= 2) {
        if (P == 2) {
            return f(std::integral_constant<int, 2>{});
        }
    }
    f(std::integral_constant<int, 1>{});
}

template <ggml_type T> void launch_cols(ggml_backend_cuda_context & ctx, cols_args & a, int grid_y) {
    const int       n_sm   = ggml_cuda_info().devices[ctx.device].nsm;
    const cols_form forced = forced_cols_form();
    const bool      split  = pyqsa_cuda_clusters_on((const void *) gemv_cols<T, 8, 1, true, 1>);
    const int       most   = step_chunks<T>(a.K, 8 * 4);  // a warp's share of K at least one lane-step
    const cols_form f      = forced.W ? forced : cols_form_of(a, grid_y, n_sm, split, most * KB);
    with_step_chunks<T>(step_chunks<T>(a.K / f.S, f.W * 4),
                        [&](auto P) { launch_in_form<T, decltype(P)::value>(ctx, a, grid_y, f); });
}

void launch_cols(ggml_backend_cuda_context & ctx, ggml_type type, cols_args & a, int grid_y) {
    pyqsa_with_gemv_weights(type, [&](auto t) { launch_cols<decltype(t)::value>(ctx, a, grid_y); });
}

bool aligned(const void * p, size_t a, size_t b, size_t to) {
    return (((uintptr_t) p | a | b) % to) == 0;
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

template <ggml_type T, int P> void launch_rows(const ggml_cuda_kernel_launch_params & p, const gemv_args & a, int r) {
    switch (r) {
        case 4: ggml_cuda_kernel_launch(gemv_one<T, 4, P>, p, a); break;
        case 2: ggml_cuda_kernel_launch(gemv_one<T, 2, P>, p, a); break;
        default: ggml_cuda_kernel_launch(gemv_one<T, 1, P>, p, a); break;
    }
}

void launch(ggml_backend_cuda_context & ctx, ggml_type type, gemv_args & a, int n_used, int r) {
    const ggml_cuda_kernel_launch_params p(dim3(number_blocks(a, WARPS * r), n_used), dim3(WARPS * WARP_SIZE), 0,
                                           ctx.stream());
    pyqsa_with_gemv_weights(type, [&](auto t) {
        constexpr ggml_type T = decltype(t)::value;
        // NOTE: one column takes 4 chunks a lane-step, not 2 (test-products perf on the H100: q6_K's
        // output layer 173.5 us against 327.6 with one; q4_K 2560 x 12288 23.4 with two against 20.6)
        if constexpr (gemv_step_chunks<T>::value == 4) {
            if (step_chunks<T>(a.K, WARP_SIZE) == 4) {
                launch_rows<T, 4>(p, a, r);
                return;
            }
        }
        launch_rows<T, 1>(p, a, r);
    });
}

// the checks every call makes: weights of a type the gemv reads, whole blocks a row, aligned for
// its loads; f32 x in 16-byte columns; NVIDIA warps
bool takes(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, const ggml_tensor * dst) {
    const auto [qk, align] = pyqsa_gemv_block_of(w->type);
    return pyqsa_cuda_gemv_on() && qk > 0 && x->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32 &&
           GGML_CUDA_CC_IS_NVIDIA(ggml_cuda_info().devices[ctx.device].cc) && w->ne[0] % qk == 0 &&
           w->ne[1] <= INT32_MAX && x->ne[0] == w->ne[0] && dst->ne[0] == w->ne[1] &&
           w->nb[0] == ggml_type_size(w->type) && x->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float) &&
           w->ne[3] == 1 && x->ne[3] == 1 && dst->ne[3] == 1 && aligned(w->data, w->nb[1], w->nb[2], align) &&
           aligned(x->data, x->nb[1], x->nb[2], 16);
}

// MUL_MATs dsts[i] = ws[i] x, i < n, of one x of T <= 8 columns, in one launch; false (nothing
// launched) where the gemv does not take one of them. The columns run along x's dim 1 (x [K, T])
// or, one a channel, along dim 2 (x [K, 1, T], w broadcast: the linear attention's output
// projection at T sequences, whose per-channel product upstream's MMVF ran as T one-column
// products, reading w T times). One column: a warp takes rows_per_warp() rows of the parts
// together, and no launch where that is one row a warp (see pyqsa_cuda_gemv).
bool launch_mul_mats(ggml_backend_cuda_context & ctx, const ggml_tensor * const * ws, const ggml_tensor * x,
                     const ggml_tensor * const * dsts, int n) {
    const int     dim  = x->ne[1] == 1 && x->ne[2] > 1 ? 2 : 1;  // the columns' dimension
    const int64_t T    = x->ne[dim];
    int64_t       rows = 0;
    for (int i = 0; i < n; ++i) {
        const ggml_tensor * w = ws[i];
        if (!takes(ctx, w, x, dsts[i]) || w->type != ws[0]->type || w->ne[2] != 1 || x->ne[3 - dim] != 1 ||
            dsts[i]->ne[dim] != T || dsts[i]->ne[3 - dim] != 1 || (T >= 2 && w->ne[0] % KB != 0)) {
            return false;
        }
        rows += w->ne[1];
    }
    const auto fill = [&](gemv_args & a) {  // expert 0; one column: u is 0, d_nb1 never used
        for (int i = 0; i < n; ++i) {  // column t of dst i at t * its nb[dim]
            a.parts[i] = { (const char *) ws[i]->data, ws[i]->nb[1], (char *) dsts[i]->data, 0, dsts[i]->nb[dim],
                           (int) ws[i]->ne[1], 0 };
        }
        a.n_parts = n;
        a.x       = (const char *) x->data;
        a.x_ne1   = 1;
        a.K       = (int) x->ne[0];
    };
    if (T >= 2 && T <= PYQSA_GEMV_MAX_COLS) {
        // T columns as one expert's pairs (t, 0): x column t at t * nb[dim]
        cols_args a = {};
        fill(a);
        a.x_nb2  = x->nb[dim];
        a.n_used = 1;
        a.n_tok  = (int) T;
        launch_cols(ctx, ws[0]->type, a, 1);
        return true;
    }
    const int r = rows_per_warp(rows, 1, ggml_cuda_info().devices[ctx.device].nsm);
    if (T != 1 || r < 2) {
        return false;
    }
    gemv_args a = {};
    fill(a);
    launch(ctx, ws[0]->type, a, 1, r);
    return true;
}

}  // namespace

bool pyqsa_cuda_gemv_reads(ggml_type type) {
    return pyqsa_gemv_block_of(type).qk > 0;
}

bool pyqsa_cuda_gemv(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, ggml_tensor * dst) {
    // NOTE: a warp a row reads a narrow matrix with too few warps in flight; upstream's CTA a row
    // was faster below two rows a warp (4096 x 2560: 12.5 us against 15.2; decode.py at one
    // sequence 8.7 ms a step against 10.0 with every MUL_MAT here), so those stay there, in a
    // group too (a hyper-connection norm's down and inject, 20 rows of 10240 as one launch of
    // three CTAs: decode.py at one sequence 7.04 ms a step against 6.53 ungrouped)
    const ggml_tensor * ws[1]   = { w };
    const ggml_tensor * dsts[1] = { dst };
    return launch_mul_mats(ctx, ws, x, dsts, 1);
}

bool pyqsa_cuda_gemv_group(ggml_backend_cuda_context & ctx, const ggml_tensor * const * dsts, int n) {
    GGML_ASSERT(n >= 1 && n <= PYQSA_GEMV_MAX_PARTS);
    const ggml_tensor * ws[PYQSA_GEMV_MAX_PARTS];
    for (int i = 0; i < n; ++i) {
        GGML_ASSERT(dsts[i]->op == GGML_OP_MUL_MAT && dsts[i]->src[1] == dsts[0]->src[1]);
        ws[i] = dsts[i]->src[0];
    }
    return launch_mul_mats(ctx, ws, dsts[0]->src[1], dsts, n);
}

bool pyqsa_cuda_gemv_id(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * w      = dst->src[0];
    const ggml_tensor * x      = dst->src[1];
    const ggml_tensor * ids    = dst->src[2];
    const int64_t       n_used = ids->ne[0], n_tok = ids->ne[1];
    // the expert products as one part, the fields both kernels read
    const auto          fill   = [&](gemv_args & a) {
        a.parts[0] = { (const char *) w->data, w->nb[1], (char *) dst->data, dst->nb[1], dst->nb[2], (int) w->ne[1], 0 };
        a.n_parts  = 1;
        a.w_nb2    = w->nb[2];
        a.x        = (const char *) x->data;
        a.x_nb1    = x->nb[1];
        a.x_ne1    = (int) x->ne[1];
        a.ids      = (const char *) ids->data;
        a.ids_nb0  = ids->nb[0];
        a.K        = (int) w->ne[0];
    };
    if (n_tok >= 2 && n_tok <= PYQSA_GEMV_MAX_COLS) {
        if (!takes(ctx, w, x, dst) || ids->type != GGML_TYPE_I32 || w->ne[0] % KB != 0 ||
            n_used * n_tok > MAX_SLOTS || x->ne[2] != n_tok || dst->ne[1] != n_used || dst->ne[2] != n_tok) {
            return false;
        }
        cols_args a = {};
        fill(a);
        a.x_nb2   = x->nb[2];
        a.ids_nb1 = ids->nb[1];
        a.n_used  = (int) n_used;
        a.n_tok   = (int) n_tok;
        launch_cols(ctx, w->type, a, (int) std::min<int64_t>(n_used * n_tok, w->ne[2]));
        return true;
    }
    if (!takes(ctx, w, x, dst) || ids->type != GGML_TYPE_I32 || ids->ne[1] != 1 || x->ne[2] != 1 ||
        dst->ne[1] != n_used || dst->ne[2] != 1 || n_used > 65535) {
        return false;
    }
    gemv_args a = {};
    fill(a);
    launch(ctx, w->type, a, (int) n_used, rows_per_warp(w->ne[1], n_used, ggml_cuda_info().devices[ctx.device].nsm));
    return true;
}
