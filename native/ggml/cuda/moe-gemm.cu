// MUL_MAT_ID on a grouped tensor-core GEMM (see moe-gemm.cuh). Three launches:
//   group:  one CTA, a thread per expert: counts the rows routed to each expert, lays the experts'
//           rows out in tiles of BM (rows[i] = the pair t * n_used + u, -1 for a tile's padding) and
//           names each tile's expert; the tile count stays on the device
//   gather: row i of A [rows, K] f16 = the activations of pair rows[i], zeros for padding
//   gemm:   grid (N / BN, the tiles' upper bound); CTAs past the tile count return at once
#include "moe-gemm.cuh"

#include "mma-ptx.cuh"
#include "pyqsa-cuda-moe.h"

#include <cstdlib>
#include <cstring>

using namespace pyqsa_mma;

namespace {

constexpr int BN          = 128;   // output columns of a CTA
constexpr int BK          = 64;    // k of a pipeline stage: rows of 128 bytes
constexpr int STAGES      = 3;
constexpr int THREADS     = 256;   // 8 warps: 2 along M x 4 along N
constexpr int MAX_EXPERTS = 1024;  // the grouping gives an expert a thread

// a [rows][BK] f16 stage tile is 8 chunks of 16 bytes a row; chunk c of row r lives at c ^ (r % 8),
// so the 8 rows one ldmatrix reads at one chunk fall in 8 different bank groups
__device__ __forceinline__ int swz(int r, int chunk) {
    return r * BK + ((chunk ^ (r & 7)) << 3);
}

struct moe_args {
    const char * ids;  // I32 [n_used, n_tok]
    size_t       ids_nb0, ids_nb1;
    const char * x;    // F32 [K, x_ne1, n_tok]: pair (t, u) reads row u % x_ne1 of token t
    size_t       x_nb1, x_nb2;
    int          x_ne1;
    const char * w;    // F16 [K, N, n_expert]
    size_t       w_nb1, w_nb2;
    char *       dst;  // F32 [N, n_used, n_tok]
    size_t       d_nb1, d_nb2;
    int          n_used, n_tok, n_expert, K, N;
};

// grid 1, MAX_EXPERTS threads, 2 * n_expert ints of shared memory
__global__ void __launch_bounds__(MAX_EXPERTS) moe_group(const moe_args a, int bm, int * rows, int * tile_expert,
                                                         int * n_tiles) {
    extern __shared__ int sh[];
    int *         count = sh;               // rows routed to each expert
    int *         fill  = sh + a.n_expert;  // the next free row of each expert's tiles
    __shared__ int warp_sum[MAX_EXPERTS / WARP_SIZE];
    const int      tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int      n_pairs = a.n_used * a.n_tok;
    const auto     expert_of = [&](int p) {
        return *(const int32_t *) (a.ids + (size_t) (p / a.n_used) * a.ids_nb1 + (size_t) (p % a.n_used) * a.ids_nb0);
    };

    for (int e = tid; e < a.n_expert; e += blockDim.x) {
        count[e] = 0;
    }
    __syncthreads();
    for (int p = tid; p < n_pairs; p += blockDim.x) {
        atomicAdd(&count[expert_of(p)], 1);
    }
    __syncthreads();

    // exclusive scan of the tiles per expert, an expert per thread
    const int tiles = tid < a.n_expert ? (count[tid] + bm - 1) / bm : 0;
    int       incl  = tiles;
#pragma unroll
    for (int o = 1; o < WARP_SIZE; o *= 2) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        incl += lane >= o ? y : 0;
    }
    if (lane == WARP_SIZE - 1) {
        warp_sum[warp] = incl;
    }
    __syncthreads();
    if (warp == 0) {
        int w = lane < (int) (blockDim.x / WARP_SIZE) ? warp_sum[lane] : 0;
#pragma unroll
        for (int o = 1; o < WARP_SIZE; o *= 2) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            w += lane >= o ? y : 0;
        }
        warp_sum[lane] = w;
    }
    __syncthreads();
    incl += warp > 0 ? warp_sum[warp - 1] : 0;
    const int first = incl - tiles;
    if (tid < a.n_expert) {
        fill[tid] = first * bm;
        for (int i = 0; i < tiles; ++i) {
            tile_expert[first + i] = tid;
        }
        for (int r = first * bm + count[tid]; r < (first + tiles) * bm; ++r) {
            rows[r] = -1;
        }
    }
    if (tid == (int) blockDim.x - 1) {
        *n_tiles = incl;
    }
    __syncthreads();
    // a row's place inside its expert's tiles does not change its sums: any order will do
    for (int p = tid; p < n_pairs; p += blockDim.x) {
        rows[atomicAdd(&fill[expert_of(p)], 1)] = p;
    }
}

// grid (the rows' upper bound), 128 threads
__global__ void moe_gather(const moe_args a, const int * rows, const int * n_tiles, int bm, half * A) {
    const int i = blockIdx.x;
    if (i >= *n_tiles * bm) {
        return;
    }
    const int p   = rows[i];
    half2 *   out = (half2 *) (A + (size_t) i * a.K);
    if (p < 0) {
        for (int j = threadIdx.x; j < a.K / 2; j += blockDim.x) {
            out[j] = __float2half2_rn(0.0f);
        }
        return;
    }
    const int      t  = p / a.n_used, u = p % a.n_used;
    const float4 * in = (const float4 *) (a.x + (size_t) t * a.x_nb2 + (size_t) (u % a.x_ne1) * a.x_nb1);
    for (int j = threadIdx.x; j < a.K / 4; j += blockDim.x) {
        const float4 v = in[j];
        out[2 * j]     = __floats2half2_rn(v.x, v.y);
        out[2 * j + 1] = __floats2half2_rn(v.z, v.w);
    }
}

template <int BM> constexpr size_t smem_bytes() {
    return (size_t) STAGES * (BM + BN) * BK * sizeof(half);
}

// grid (N / BN, tiles' upper bound), THREADS threads, smem_bytes<BM>() of shared memory. A warp
// computes a [BM / 2, 32] block of the CTA's [BM, BN] tile: MT m-tiles of 16 rows by 4 n-tiles of 8.
template <int BM>
__global__ void __launch_bounds__(THREADS, 2) moe_gemm(const moe_args a, const half * A, const int * rows,
                                                       const int * tile_expert, const int * n_tiles) {
#if __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
    constexpr int MT = BM / 32;
    constexpr int NT = 4;
    extern __shared__ __align__(16) char smem[];
    half *        As = (half *) smem;        // [STAGES][BM][BK]
    half *        Bs = As + STAGES * BM * BK;  // [STAGES][BN][BK]: an expert row of K per output column

    const int tile = blockIdx.y;
    if (tile >= *n_tiles) {
        return;
    }
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int wm = warp / 4, wn = warp % 4;
    const int g = lane / 4, t4 = lane % 4;
    const int n0 = blockIdx.x * BN;

    const half * a_rows = A + (size_t) tile * BM * a.K;
    const char * w_rows = a.w + (size_t) tile_expert[tile] * a.w_nb2 + (size_t) n0 * a.w_nb1;
    const int    KT     = a.K / BK;
    const auto   load   = [&](int stage, int kt) {
        half * as = As + stage * BM * BK;
        half * bs = Bs + stage * BN * BK;
        for (int i = tid; i < BM * (BK / 8); i += THREADS) {
            const int r = i / (BK / 8), ch = i % (BK / 8);
            cp_async_16(as + swz(r, ch), a_rows + (size_t) r * a.K + kt * BK + ch * 8);
        }
        for (int i = tid; i < BN * (BK / 8); i += THREADS) {
            const int n = i / (BK / 8), ch = i % (BK / 8);
            cp_async_16(bs + swz(n, ch), w_rows + (size_t) n * a.w_nb1 + (size_t) (kt * BK + ch * 8) * sizeof(half));
        }
    };

    float acc[MT][NT][4] = {};
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) {
            load(s, s);
        }
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage kt has landed, and every warp is done with the stage refilled next
        if (kt + STAGES - 1 < KT) {
            load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        }
        cp_async_commit();
        const half * as = As + (kt % STAGES) * BM * BK;
        const half * bs = Bs + (kt % STAGES) * BN * BK;
#pragma unroll
        for (int kh = 0; kh < BK / 32; ++kh) {
            // two k-steps of 16 for each n-tile: b[nt][0..1] the first, b[nt][2..3] the second
            uint32_t b[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                ldmatrix_x4(b[nt], bs + swz(wn * 32 + nt * 8 + lane % 8, kh * 4 + lane / 8));
            }
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    uint32_t af[4];
                    ldmatrix_x4(af, as + swz(wm * (BM / 2) + mt * 16 + lane % 16, (kh * 2 + ks) * 2 + lane / 16));
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        mma_f16(acc[mt][nt], af, b[nt][2 * ks], b[nt][2 * ks + 1]);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    // rows g and g + 8 of every m-tile, columns 2 * t4 and 2 * t4 + 1 of every n-tile
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int p = rows[(size_t) tile * BM + wm * (BM / 2) + mt * 16 + g + 8 * hr];
            if (p < 0) {
                continue;
            }
            float * o = (float *) (a.dst + (size_t) (p / a.n_used) * a.d_nb2 + (size_t) (p % a.n_used) * a.d_nb1) + n0 +
                        wn * 32 + 2 * t4;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                *(float2 *) (o + nt * 8) = make_float2(acc[mt][nt][2 * hr], acc[mt][nt][2 * hr + 1]);
            }
        }
    }
#else
    GGML_UNUSED_VARS(a, A, rows, tile_expert, n_tiles);
    NO_DEVICE_CODE;
#endif
}

bool aligned16(const void * p, size_t a, size_t b) {
    return ((uintptr_t) p | a | b) % 16 == 0;
}

// the tile height: PYQSA_CUDA_MOE_BM when 64 or 128; else 128 once the experts average 128 rows
// and 128-row tiles still give every SM two CTAs (measured on the H200: 64 won where the products
// had few column blocks or few rows an expert)
int tile_rows(int64_t n_pairs, int64_t n_expert, int64_t N, int n_sm) {
    const char * v = getenv("PYQSA_CUDA_MOE_BM");
    if (v != nullptr && (strcmp(v, "64") == 0 || strcmp(v, "128") == 0)) {
        return atoi(v);
    }
    const int64_t ctas = N / BN * ((n_pairs + 127) / 128);
    return n_pairs >= 128 * n_expert && ctas >= 2 * n_sm ? 128 : 64;
}

// sum over experts of ceil(rows / bm) <= n_pairs / bm + the experts that have rows
int64_t max_tiles(int bm, int64_t n_pairs, int64_t n_expert) {
    return (n_pairs + bm - 1) / bm + std::min<int64_t>(n_expert, n_pairs);
}

template <int BM>
void launch(ggml_backend_cuda_context & ctx, const moe_args & a) {
    cudaStream_t  stream    = ctx.stream();
    const int64_t n_tiles_at_most = max_tiles(BM, (int64_t) a.n_used * a.n_tok, a.n_expert);

    ggml_cuda_pool_alloc<int>  rows(ctx.pool(), n_tiles_at_most * BM);
    ggml_cuda_pool_alloc<int>  tile_expert(ctx.pool(), n_tiles_at_most);
    ggml_cuda_pool_alloc<int>  n_tiles(ctx.pool(), 1);
    ggml_cuda_pool_alloc<half> A(ctx.pool(), n_tiles_at_most * BM * a.K);

    moe_group<<<1, MAX_EXPERTS, 2 * a.n_expert * sizeof(int), stream>>>(a, BM, rows.get(), tile_expert.get(),
                                                                           n_tiles.get());
    CUDA_CHECK(cudaGetLastError());
    moe_gather<<<(unsigned) (n_tiles_at_most * BM), 128, 0, stream>>>(a, rows.get(), n_tiles.get(), BM, A.get());
    CUDA_CHECK(cudaGetLastError());

    constexpr size_t bytes = smem_bytes<BM>();
    static bool      raised[GGML_CUDA_MAX_DEVICES] = {};
    if (!raised[ctx.device]) {
        CUDA_CHECK(cudaFuncSetAttribute(moe_gemm<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes));
        raised[ctx.device] = true;
    }
    moe_gemm<BM><<<dim3(a.N / BN, (unsigned) n_tiles_at_most), THREADS, bytes, stream>>>(a, A.get(), rows.get(),
                                                                                  tile_expert.get(), n_tiles.get());
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool pyqsa_cuda_moe_gemm(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * w   = dst->src[0];
    const ggml_tensor * x   = dst->src[1];
    const ggml_tensor * ids = dst->src[2];
    if (!pyqsa_cuda_moe_on_device() || !pyqsa_cuda_moe_grouped()) {
        return false;
    }
    if (w->type != GGML_TYPE_F16 || x->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 || ids->type != GGML_TYPE_I32) {
        return false;
    }
    const int64_t K = w->ne[0], N = w->ne[1], n_expert = w->ne[2];
    const int64_t n_used = ids->ne[0], n_tok = ids->ne[1];
    if (K % BK != 0 || N % BN != 0 || n_expert > MAX_EXPERTS || w->ne[3] != 1 || x->ne[3] != 1 || dst->ne[3] != 1 ||
        x->ne[2] != n_tok || dst->ne[1] != n_used || dst->ne[2] != n_tok || n_tok < PYQSA_MOE_GEMM_MIN_TOKENS ||
        n_used * n_tok < PYQSA_MOE_GEMM_MIN_ROWS * n_expert ||
        n_used * n_tok > INT32_MAX / 2 || max_tiles(64, n_used * n_tok, n_expert) > 65535) {
        return false;
    }
    if (w->nb[0] != sizeof(half) || x->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float) ||
        !aligned16(w->data, w->nb[1], w->nb[2]) || !aligned16(x->data, x->nb[1], x->nb[2]) ||
        (((uintptr_t) dst->data | dst->nb[1] | dst->nb[2]) % 8) != 0 ||
        ggml_cuda_info().devices[ctx.device].cc < GGML_CUDA_CC_AMPERE) {
        return false;
    }
    const moe_args a = { (const char *) ids->data, ids->nb[0], ids->nb[1],  (const char *) x->data, x->nb[1],
                         x->nb[2],                 (int) x->ne[1],          (const char *) w->data, w->nb[1],
                         w->nb[2],                 (char *) dst->data,      dst->nb[1],             dst->nb[2],
                         (int) n_used,             (int) n_tok,             (int) n_expert,         (int) K,
                         (int) N };
    if (tile_rows(n_used * n_tok, n_expert, N, ggml_cuda_info().devices[ctx.device].nsm) == 128) {
        launch<128>(ctx, a);
    } else {
        launch<64>(ctx, a);
    }
    return true;
}
