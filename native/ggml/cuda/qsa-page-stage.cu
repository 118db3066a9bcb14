// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_STAGE: the window's blocks that some query selects are
// marked in a bitmap per stream, then one CTA per (slot, stream, K or V) copies its block from the
// host store when marked (pinned memory read over PCIe, qsa-page-copy.cuh).
#include "qsa-page-stage.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"
#include "qsa-page-copy.cuh"

namespace {

// grid (entries / 256, stream): marks the selected blocks of [b0, b0 + S) below n_paged
__global__ void page_stage_mark(const int32_t * blocks, const int32_t * n_paged, uint32_t * bits, int kb, int n_q,
                                int b0, int S, int n_words) {
    const int s = blockIdx.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= kb * n_q) {
        return;
    }
    const int b = blocks[(size_t) s * kb * n_q + e];
    if (b >= b0 && b < b0 + S && b < n_paged[s * n_q + e / kb]) {
        atomicOr(&bits[(size_t) s * n_words + (b - b0) / 32], 1u << ((b - b0) % 32));
    }
}

// grid (S, stream, K or V)
__global__ void page_stage_copy(const uint32_t * bits, const char * store0, char * dev0, const char * store1,
                                char * dev1, int b0, int n_words, size_t B, size_t B_store, int n_q8,
                                size_t stream_bytes, long long n_store) {
    const int i = blockIdx.x;
    const int s = blockIdx.y;
    if (!(bits[(size_t) s * n_words + i / 32] >> (i % 32) & 1u)) {
        return;
    }
    const char * store = blockIdx.z == 0 ? store0 : store1;
    char *       dev   = blockIdx.z == 0 ? dev0 : dev1;
    pyqsa_fetch_row(dev + (size_t) s * stream_bytes + (size_t) i * B, store + ((size_t) s * n_store + b0 + i) * B_store,
                    B, n_q8);
}

// grid (stream): the blocks each stream copied, also added to its tally when there is one
__global__ void page_stage_count(const uint32_t * bits, int32_t * out, long long * tally, int n_words) {
    int n = 0;
    for (int w = threadIdx.x; w < n_words; w += blockDim.x) {
        n += __popc(bits[(size_t) blockIdx.x * n_words + w]);
    }
    n = warp_reduce_sum(n);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = n;
        if (tally != nullptr) {
            tally[blockIdx.x] += n;
        }
    }
}

}  // namespace

void pyqsa_cuda_qsa_page_stage(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks  = dst->src[0];
    const ggml_tensor * stage   = dst->src[2];
    const ggml_tensor * stage_v = dst->src[3];
    const int kb = (int) blocks->ne[0], n_q = (int) blocks->ne[1], ns = (int) blocks->ne[2];
    const int S  = (int) stage->ne[1];
    const int b0 = ggml_get_op_params_i32(dst, 6);
    int64_t      n_store = 0;
    const char * store   = (const char *) pyqsa_ggml_qsa_page_store(dst, 0, &n_store);
    const char * store_v = (const char *) pyqsa_ggml_qsa_page_store(dst, 1, &n_store);
    const int    n_words = (S + 31) / 32;

    cudaStream_t                   stream = ctx.stream();
    ggml_cuda_pool_alloc<uint32_t> bits(ctx.pool(), (size_t) ns * n_words);
    CUDA_CHECK(cudaMemsetAsync(bits.get(), 0, (size_t) ns * n_words * sizeof(uint32_t), stream));
    page_stage_mark<<<dim3((kb * n_q + 255) / 256, ns), 256, 0, stream>>>(
        (const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data, bits.get(), kb, n_q, b0, S, n_words);
    CUDA_CHECK(cudaGetLastError());
    page_stage_copy<<<dim3(S, ns, stage_v ? 2 : 1), 256, 0, stream>>>(
        bits.get(), store, (char *) stage->data, store_v, stage_v ? (char *) stage_v->data : nullptr, b0, n_words,
        stage->nb[1], pyqsa_ggml_qsa_page_store_row(dst), pyqsa_cuda_page_q8_elems(dst), stage->nb[2], n_store);
    CUDA_CHECK(cudaGetLastError());
    page_stage_count<<<ns, WARP_SIZE, 0, stream>>>(bits.get(), (int32_t *) dst->data,
                                                   dst->src[5] ? (long long *) dst->src[5]->data : nullptr, n_words);
    CUDA_CHECK(cudaGetLastError());
}

bool pyqsa_cuda_qsa_page_stage_supported(const ggml_tensor * op) {
    return pyqsa_cuda_page_stores_mapped(op) && op->src[0]->ne[2] <= 65535 && op->src[2]->ne[1] <= INT32_MAX;
}
