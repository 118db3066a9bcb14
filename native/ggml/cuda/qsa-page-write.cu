// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_WRITE: one CTA per (row, K or V) copies a row of the
// device cache to its row of the host store (pinned memory, written in place).
#include "qsa-page-write.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"
#include "qsa-page-copy.cuh"

#include "ggml-cuda/cpy-utils.cuh"

namespace {

// grid (row, K or V); src_rows null: row i of k/v. n_q8 > 0: f32 rows of n_q8 elements written
// as q8_0 blocks, a thread a block, by the quantization CUDA's set_rows uses (cpy-utils.cuh), so
// the store holds what an unpaged q8_0 cache would
__global__ void page_write(const char * k, const char * v, char * k_host, char * v_host, const int64_t * src_rows,
                           const int64_t * k_rows, const int64_t * v_rows, size_t B, size_t B_store, int n_q8) {
    const long long dst_row = (blockIdx.y == 0 ? k_rows : v_rows)[blockIdx.x];
    if (dst_row < 0) {
        return;
    }
    char *       dst = (blockIdx.y == 0 ? k_host : v_host) + (size_t) dst_row * B_store;
    const char * src = (blockIdx.y == 0 ? k : v) + (size_t) (src_rows ? src_rows[blockIdx.x] : blockIdx.x) * B;
    if (n_q8 == 0) {
        pyqsa_copy_row(dst, src, B);
        return;
    }
    for (int j = threadIdx.x; j < n_q8 / QK8_0; j += blockDim.x) {
        quantize_f32_q8_0_block((const float *) src + j * QK8_0, (block_q8_0 *) dst + j);
    }
}

}  // namespace

void pyqsa_cuda_qsa_page_write(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * k    = dst->src[0];
    const int64_t       n    = ggml_nelements(dst->src[3]);
    const int           n_q8 = pyqsa_ggml_qsa_page_store_type(dst) != k->type ? (int) k->ne[0] : 0;
    if (n == 0) {
        return;
    }
    page_write<<<dim3((unsigned) n, 2), 128, 0, ctx.stream()>>>(
        (const char *) k->data, (const char *) dst->src[1]->data, (char *) pyqsa_ggml_host_ptr(dst, 2),
        (char *) pyqsa_ggml_host_ptr(dst, 4), dst->src[2] ? (const int64_t *) dst->src[2]->data : nullptr,
        (const int64_t *) dst->src[3]->data, (const int64_t *) dst->src[4]->data, k->nb[1],
        pyqsa_ggml_qsa_page_store_row(dst), n_q8);
    CUDA_CHECK(cudaGetLastError());
}

bool pyqsa_cuda_qsa_page_write_supported(const ggml_tensor * op) {
    return pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 2)) && pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 4)) &&
           ggml_nelements(op->src[3]) <= INT32_MAX;
}

