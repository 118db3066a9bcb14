// CUDA kernel of PYQSA_GGML_OP_QSA_BLOCK_CELLS: one CTA per query row, one thread per output slot.
#include "qsa-block-cells.cuh"

namespace {

__global__ void block_cells(const int32_t * blocks, const int32_t * n_vis, const int32_t * pos,
                            int32_t * dst, int kb, int r, int n_out) {
    const int row = blockIdx.x;
    const int vis = n_vis[row];
    for (int j = threadIdx.x; j < n_out; j += blockDim.x) {
        int cell;
        if (j < kb * r) {
            const int blk = blocks[(size_t) row * kb + j / r];
            cell = blk < vis ? blk * r + j % r : -1;
        } else {
            const int c = vis * r + (j - kb * r);
            cell = c <= pos[row] ? c : -1;
        }
        dst[(size_t) row * n_out + j] = cell;
    }
}

}  // namespace

void pyqsa_cuda_qsa_block_cells(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks = dst->src[0];
    const int rows  = (int) ggml_nrows(blocks);
    const int kb    = (int) blocks->ne[0];
    const int r     = ggml_get_op_params_i32(dst, 1);
    const int n_out = (int) dst->ne[0];
    block_cells<<<rows, 256, 0, ctx.stream()>>>((const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data,
                                               (const int32_t *) dst->src[2]->data, (int32_t *) dst->data, kb, r, n_out);
    CUDA_CHECK(cudaGetLastError());
}
