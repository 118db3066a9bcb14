// CUDA kernel of PYQSA_GGML_OP_QSA_MASK_CELLS: one CTA per query row compacts the finite mask
// entries in order: each pass over 1024 cells takes a warp ballot per warp and a prefix over the
// warps' counts, so the output stays sorted like the CPU kernel's.
#include "qsa-mask-cells.cuh"

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;

template <typename T> __device__ __forceinline__ bool visible(T x);
template <> __device__ __forceinline__ bool visible<float>(float x) { return x != -INFINITY; }
template <> __device__ __forceinline__ bool visible<half>(half x) { return __half2float(x) != -INFINITY; }

template <typename T>
__global__ void mask_cells(const char * mask, int32_t * out, int n_kv, int n_tps, int n_sel,
                           size_t nb1, size_t nb3) {
    const int row  = blockIdx.x;
    const int i    = row % n_tps;
    const int s    = row / n_tps;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const T * src  = (const T *) (mask + i * nb1 + s * nb3);
    int32_t * dst  = out + (size_t) row * n_sel;

    __shared__ int warp_count[WARPS];
    __shared__ int base;
    if (threadIdx.x == 0) {
        base = 0;
    }
    __syncthreads();

    for (int c0 = 0; c0 < n_kv && base < n_sel; c0 += THREADS) {
        const int  c    = c0 + threadIdx.x;
        const bool keep = c < n_kv && visible<T>(src[c]);
        const unsigned ballot = __ballot_sync(0xffffffff, keep);
        if (lane == 0) {
            warp_count[warp] = __popc(ballot);
        }
        __syncthreads();
        int offset = base;
        for (int w = 0; w < warp; ++w) {
            offset += warp_count[w];
        }
        offset += __popc(ballot & ((1u << lane) - 1));
        if (keep && offset < n_sel) {
            dst[offset] = c;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 0; w < WARPS; ++w) {
                base += warp_count[w];
            }
        }
        __syncthreads();
    }
    for (int j = min(base, n_sel) + threadIdx.x; j < n_sel; j += THREADS) {
        dst[j] = -1;
    }
}

}  // namespace

void pyqsa_cuda_qsa_mask_cells(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * mask = dst->src[0];  // [n_kv, n_tps, 1, ns]
    const int n_kv  = (int) mask->ne[0];
    const int n_tps = (int) mask->ne[1];
    const int rows  = (int) (mask->ne[1] * mask->ne[3]);
    const int n_sel = (int) dst->ne[0];
    if (mask->type == GGML_TYPE_F32) {
        mask_cells<float><<<rows, THREADS, 0, ctx.stream()>>>((const char *) mask->data, (int32_t *) dst->data,
                                                             n_kv, n_tps, n_sel, mask->nb[1], mask->nb[3]);
    } else {
        mask_cells<half><<<rows, THREADS, 0, ctx.stream()>>>((const char *) mask->data, (int32_t *) dst->data,
                                                            n_kv, n_tps, n_sel, mask->nb[1], mask->nb[3]);
    }
    CUDA_CHECK(cudaGetLastError());
}
