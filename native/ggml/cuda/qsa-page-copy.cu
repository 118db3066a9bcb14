// The block fetch of the paging ops (see qsa-page-copy.cuh).
#include "qsa-page-copy.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"

namespace {

// grid (i, stream, K or V)
__global__ void page_fetch(const char * store0, char * dev0, const char * store1, char * dev1, const int32_t * blocks,
                           const int32_t * slots, const int32_t * n_blocks, int stride, size_t B, size_t B_store,
                           int n_q8, size_t stream_bytes, long long n_store) {
    const int s = blockIdx.y;
    const int i = blockIdx.x;
    if (i >= n_blocks[s]) {
        return;
    }
    const char * store = blockIdx.z == 0 ? store0 : store1;
    char *       dev   = blockIdx.z == 0 ? dev0 : dev1;
    const int    to    = slots[(size_t) s * stride + i];
    pyqsa_fetch_row(dev + (size_t) s * stream_bytes + (size_t) to * B,
                    store + ((size_t) s * n_store + blocks[(size_t) s * stride + i]) * B_store, B, n_q8);
}

}  // namespace

void pyqsa_cuda_page_fetch(cudaStream_t stream, const char * store0, char * dev0, const char * store1, char * dev1,
                           const int32_t * blocks, const int32_t * slots, const int32_t * n_blocks, int max_blocks,
                           int ns, int stride, size_t B, size_t B_store, int n_q8, size_t stream_bytes,
                           long long n_store) {
    const dim3 grid(max_blocks, ns, dev1 ? 2 : 1);
    page_fetch<<<grid, 256, 0, stream>>>(store0, dev0, store1, dev1, blocks, slots, n_blocks, stride, B, B_store, n_q8,
                                         stream_bytes, n_store);
    CUDA_CHECK(cudaGetLastError());
}

int pyqsa_cuda_page_q8_elems(const ggml_tensor * op) {
    const ggml_tensor * rows = pyqsa_ggml_qsa_page_rows(op);
    const bool dequant = pyqsa_ggml_qsa_page_store_type(op) == GGML_TYPE_Q8_0 && rows->type == GGML_TYPE_F16;
    return dequant ? (int) rows->ne[0] : 0;
}

bool pyqsa_cuda_page_stores_mapped(const ggml_tensor * op) {
    for (int k = 0; k < 2; ++k) {
        int64_t      n_store = 0;
        const void * store   = pyqsa_ggml_qsa_page_store(op, k, &n_store);
        if ((k == 0 || store != nullptr) && !pyqsa_cuda_host_mapped(store)) {
            return false;
        }
    }
    return true;
}
