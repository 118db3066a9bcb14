// CUDA kernel of PYQSA_GGML_OP_QSA_BLOCK_CELLS: one CTA per query row, one thread per output slot.
#include "qsa-block-cells.cuh"

namespace {

// n_paged == nullptr: cell index == position; else blocks below n_paged come from their hot slot
// and every other cell from the ring after the hot cells (see pyqsa-ggml.h)
__global__ void block_cells(const int32_t * blocks, const int32_t * n_vis, const int32_t * pos,
                            const int32_t * slots, const int32_t * n_paged, int32_t * dst, int kb, int r,
                            int n_out, int hot_cells, int ring) {
    const int row = blockIdx.x;
    const int vis = n_vis[row];
    const int pgd = n_paged ? n_paged[row] : 0;
    for (int j = threadIdx.x; j < n_out; j += blockDim.x) {
        int cell = -1;
        int c    = -1;
        if (j < kb * r) {
            const int blk = blocks[(size_t) row * kb + j / r];
            if (blk < vis) {
                if (blk < pgd) {
                    const int slot = slots[(size_t) row * kb + j / r];
                    cell           = slot >= 0 ? slot * r + j % r : -1;
                } else {
                    c = blk * r + j % r;
                }
            }
        } else {
            const int t = vis * r + (j - kb * r);
            c           = t <= pos[row] ? t : -1;
        }
        if (c >= 0) {
            cell = n_paged ? hot_cells + c % ring : c;
        }
        dst[(size_t) row * n_out + j] = cell;
    }
}

}  // namespace

void pyqsa_cuda_qsa_block_cells(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks = dst->src[0];
    const bool paged = dst->src[4] != nullptr;
    const int  rows  = (int) ggml_nrows(blocks);
    const int  kb    = (int) blocks->ne[0];
    const int  r     = ggml_get_op_params_i32(dst, 1);
    const int  n_out = (int) dst->ne[0];
    block_cells<<<rows, 256, 0, ctx.stream()>>>(
        (const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data, (const int32_t *) dst->src[2]->data,
        dst->src[3] ? (const int32_t *) dst->src[3]->data : nullptr, paged ? (const int32_t *) dst->src[4]->data : nullptr,
        (int32_t *) dst->data, kb, r, n_out, ggml_get_op_params_i32(dst, 2), ggml_get_op_params_i32(dst, 3));
    CUDA_CHECK(cudaGetLastError());
}
