// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_STAGE: one CTA per stream ranks the stream's selected
// stored blocks (a bitmap, its popcount prefix), then the fetch copies the first S of them from
// the host store into the staging slots (qsa-page-copy.cuh).
#include "qsa-page-stage.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"
#include "qsa-page-copy.cuh"

#include <cub/cub.cuh>

namespace {

constexpr int STAGE_THREADS = 1024;

// one CTA per stream: a bitmap of the stream's selected stored blocks, its popcount prefix (the
// rank of each block in increasing order), each selection's slot (its rank, below S) and the
// list of staged blocks by slot
__global__ void page_stage_rank(const int32_t * blocks, const int32_t * n_paged, uint32_t * bits, int32_t * rank0,
                                int32_t * list, int32_t * n_staged, int32_t * out, int kb, int n_q, int n_words,
                                int S) {
    using block_scan = cub::BlockScan<int, STAGE_THREADS>;
    __shared__ typename block_scan::TempStorage scan_tmp;

    const int s = blockIdx.x;
    const int M = kb * n_q;
    blocks += (size_t) s * M;
    out += (size_t) s * M;
    n_paged += (size_t) s * n_q;
    bits += (size_t) s * n_words;
    rank0 += (size_t) s * n_words;
    list += (size_t) s * S;

    for (int w = threadIdx.x; w < n_words; w += blockDim.x) {
        bits[w] = 0;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < M; e += blockDim.x) {
        const int b = blocks[e];
        if (b < n_paged[e / kb]) {
            atomicOr(&bits[b >> 5], 1u << (b & 31));
        }
    }
    __syncthreads();

    // each thread a contiguous run of words, so ranks follow block order
    const int per = (n_words + blockDim.x - 1) / blockDim.x;
    const int w0  = min(n_words, (int) threadIdx.x * per);
    const int w1  = min(n_words, w0 + per);
    int       local = 0;
    for (int w = w0; w < w1; ++w) {
        local += __popc(bits[w]);
    }
    int before = 0, total = 0;
    block_scan(scan_tmp).ExclusiveSum(local, before, total);
    for (int w = w0; w < w1; ++w) {
        rank0[w] = before;
        before += __popc(bits[w]);
    }
    __syncthreads();

    for (int e = threadIdx.x; e < M; e += blockDim.x) {
        const int b    = blocks[e];
        int       slot = -1;
        if (b < n_paged[e / kb]) {
            const int rank = rank0[b >> 5] + __popc(bits[b >> 5] & ((1u << (b & 31)) - 1u));
            slot           = rank < S ? rank : -1;
        }
        out[e] = slot;
    }
    for (int w = w0; w < w1; ++w) {
        uint32_t word = bits[w];
        for (int rank = rank0[w]; word != 0 && rank < S; ++rank) {
            list[rank] = w * 32 + __ffs(word) - 1;
            word &= word - 1;
        }
    }
    if (threadIdx.x == 0) {
        n_staged[s] = min(total, S);
    }
}

}  // namespace

void pyqsa_cuda_qsa_page_stage(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks  = dst->src[0];
    const ggml_tensor * stage   = dst->src[2];
    const ggml_tensor * stage_v = dst->src[3];
    const int kb = (int) blocks->ne[0], n_q = (int) blocks->ne[1], ns = (int) blocks->ne[2];
    const int S  = (int) stage->ne[1];
    int64_t      n_store = 0;
    const char * store   = (const char *) pyqsa_ggml_qsa_page_store(dst, 0, &n_store);
    const char * store_v = (const char *) pyqsa_ggml_qsa_page_store(dst, 1, &n_store);
    const int    n_words = (int) ((n_store + 31) / 32);

    ggml_cuda_pool_alloc<uint32_t> bits(ctx.pool(), (size_t) ns * n_words);
    ggml_cuda_pool_alloc<int32_t>  rank0(ctx.pool(), (size_t) ns * n_words);
    ggml_cuda_pool_alloc<int32_t>  list(ctx.pool(), (size_t) ns * S);
    ggml_cuda_pool_alloc<int32_t>  n_staged(ctx.pool(), ns);
    page_stage_rank<<<ns, STAGE_THREADS, 0, ctx.stream()>>>(
        (const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data, bits.get(), rank0.get(), list.get(),
        n_staged.get(), (int32_t *) dst->data, kb, n_q, n_words, S);
    CUDA_CHECK(cudaGetLastError());
    pyqsa_cuda_page_fetch(ctx.stream(), store, (char *) stage->data, store_v,
                          stage_v ? (char *) stage_v->data : nullptr, list.get(), nullptr, n_staged.get(), S, ns, S,
                          stage->nb[1], stage->nb[2], n_store);
}

bool pyqsa_cuda_qsa_page_stage_supported(const ggml_tensor * op) {
    for (int k = 0; k < (op->src[3] ? 2 : 1); ++k) {
        int64_t n_store = 0;
        if (!pyqsa_cuda_host_mapped(pyqsa_ggml_qsa_page_store(op, k, &n_store))) {
            return false;
        }
    }
    return op->src[0]->ne[2] <= 65535 && op->src[2]->ne[1] <= 65535;
}

