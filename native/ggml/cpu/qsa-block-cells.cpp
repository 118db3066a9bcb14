// CPU kernel of PYQSA_GGML_OP_QSA_BLOCK_CELLS: one query row per work item.
#include "qsa-block-cells.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"

void pyqsa_cpu_qsa_block_cells(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * blocks = dst->src[0];  // [kb, rows]
    const int32_t *     n_vis  = (const int32_t *) dst->src[1]->data;
    const int32_t *     pos    = (const int32_t *) dst->src[2]->data;
    const int32_t       r      = ggml_get_op_params_i32(dst, 1);
    const int64_t       kb     = blocks->ne[0];
    const int64_t       n_out  = dst->ne[0];
    const int64_t       rows   = ggml_nrows(blocks);
    // paged: slots of the blocks in the host store, the ring after the hot cells for the rest
    const bool      paged     = dst->src[4] != nullptr;
    const int32_t * slots     = dst->src[3] ? (const int32_t *) dst->src[3]->data : nullptr;
    const int32_t * n_paged   = paged ? (const int32_t *) dst->src[4]->data : nullptr;
    const int32_t   hot_cells = ggml_get_op_params_i32(dst, 2);
    const int32_t   ring      = ggml_get_op_params_i32(dst, 3);
    const auto      row_of    = [&](int32_t cell) { return paged ? hot_cells + cell % ring : cell; };
    const auto      paged_row = [&](int64_t row, int64_t j, int32_t t) {
        const int32_t slot = slots[row * kb + j / r];
        return slot >= 0 ? slot * r + t : -1;
    };

    for (int64_t row = params->ith; row < rows; row += params->nth) {
        const int32_t * b   = (const int32_t *) ((const char *) blocks->data + row * blocks->nb[1]);
        int32_t *       out = (int32_t *) ((char *) dst->data + row * dst->nb[1]);
        for (int64_t j = 0; j < n_out; ++j) {
            int32_t cell = -1;
            if (j < kb * r) {
                const int32_t blk = b[j / r];
                const int32_t t   = (int32_t) (j % r);
                if (blk < n_vis[row]) {
                    cell = paged && blk < n_paged[row] ? paged_row(row, j, t) : row_of(blk * r + t);
                }
            } else {
                const int32_t c = n_vis[row] * r + (int32_t) (j - kb * r);
                cell = c <= pos[row] ? row_of(c) : -1;
            }
            out[j] = cell;
        }
    }
}
