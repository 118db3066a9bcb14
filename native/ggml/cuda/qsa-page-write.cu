// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_WRITE: one CTA per (row, K or V) copies a row of the
// device cache to its row of the host store (pinned memory, written in place).
#include "qsa-page-write.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"
#include "qsa-page-copy.cuh"

namespace {

__global__ void page_write(const char * k, const char * v, char * k_host, char * v_host, const int64_t * src_rows,
                           const int64_t * k_rows, const int64_t * v_rows, size_t B) {
    const long long dst_row = (blockIdx.y == 0 ? k_rows : v_rows)[blockIdx.x];
    if (dst_row < 0) {
        return;
    }
    pyqsa_copy_row((blockIdx.y == 0 ? k_host : v_host) + (size_t) dst_row * B,
                   (blockIdx.y == 0 ? k : v) + (size_t) src_rows[blockIdx.x] * B, B);
}

}  // namespace

void pyqsa_cuda_qsa_page_write(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * k = dst->src[0];
    const int64_t       n = ggml_nelements(dst->src[2]);
    if (n == 0) {
        return;
    }
    page_write<<<dim3((unsigned) n, 2), 128, 0, ctx.stream()>>>(
        (const char *) k->data, (const char *) dst->src[1]->data, (char *) pyqsa_ggml_host_ptr(dst, 2),
        (char *) pyqsa_ggml_host_ptr(dst, 4), (const int64_t *) dst->src[2]->data, (const int64_t *) dst->src[3]->data,
        (const int64_t *) dst->src[4]->data, k->nb[1]);
    CUDA_CHECK(cudaGetLastError());
}

bool pyqsa_cuda_qsa_page_write_supported(const ggml_tensor * op) {
    return pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 2)) && pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 4)) &&
           ggml_nelements(op->src[2]) <= INT32_MAX;
}

