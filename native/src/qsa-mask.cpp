// QSA block selection for the masked attention path (see qsa-mask.h).
#include "qsa-mask.h"

#include "pyqsa-ggml.h"

#include <cmath>

pyqsa_qsa_selection pyqsa_qsa_select_blocks(ggml_context * ctx, ggml_tensor * score,
                                            ggml_tensor * comp, ggml_tensor * force,
                                            ggml_tensor * cell_blk, ggml_tensor * kq_mask,
                                            int64_t kb) {
    const int64_t n_blocks = score->ne[0];
    const int64_t n_tps    = score->ne[1];
    const int64_t n_stream = score->ne[2];
    const int64_t n_kv     = cell_blk->ne[0];

    GGML_ASSERT(kb > 0 && kb <= n_blocks);
    GGML_ASSERT(kq_mask->ne[0] == n_kv && kq_mask->ne[1] == n_tps && kq_mask->ne[3] == n_stream);

    // candidates only, exact ties to the lower block index on every backend. When fewer than kb
    // blocks are candidates, the extra picks score -inf and are tail, future, foreign or padding
    // blocks: forced anyway or dropped by kq_mask.
    ggml_tensor * cand   = ggml_add(ctx, score, comp);
    ggml_tensor * blocks = pyqsa_ggml_qsa_topk(ctx, cand, nullptr, kb);  // I32 [kb, n_tps, n_stream]

    // allow[b] = 0 for forced or selected blocks, else -inf. set_rows on rows of one element:
    // [1, n_blocks, n_tps, n_stream] <- zeros [1, kb, n_tps, n_stream] at blocks [kb, n_tps, n_stream, 1]
    ggml_tensor * allow = ggml_cont(ctx, force);
    allow = ggml_reshape_4d(ctx, allow, 1, n_blocks, n_tps, n_stream);
    ggml_tensor * zeros = ggml_fill(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, kb, n_tps, n_stream), 0.0f);
    ggml_tensor * idx   = ggml_reshape_4d(ctx, ggml_cont(ctx, blocks), kb, n_tps, n_stream, 1);
    allow = ggml_set_rows(ctx, allow, zeros, idx);
    allow = ggml_reshape_3d(ctx, allow, n_blocks, n_tps, n_stream);

    // every cell takes its block's value: rows are blocks after the permute
    // [n_blocks, n_tps, ns] -> [n_tps, n_blocks, ns] -get_rows(cell_blk)-> [n_tps, n_kv, ns]
    ggml_tensor * cells = ggml_get_rows(ctx, ggml_cont(ctx, ggml_permute(ctx, allow, 1, 0, 2, 3)), cell_blk);
    cells = ggml_cont(ctx, ggml_permute(ctx, cells, 1, 0, 2, 3));  // [n_kv, n_tps, ns]

    ggml_tensor * mask = kq_mask->type == GGML_TYPE_F32 ? kq_mask : ggml_cast(ctx, kq_mask, GGML_TYPE_F32);
    mask = ggml_add(ctx, ggml_reshape_4d(ctx, cells, n_kv, n_tps, 1, n_stream), mask);

    return { blocks, mask };
}

ggml_tensor * pyqsa_q_by_stream(ggml_context * ctx, ggml_tensor * q, int64_t n_stream) {
    GGML_ASSERT(q->ne[3] == 1 && q->ne[2] % n_stream == 0);
    const int64_t n_tps = q->ne[2] / n_stream;
    return ggml_view_4d(ctx, q, q->ne[0], q->ne[1], n_tps, n_stream, q->nb[1], q->nb[2], n_tps * q->nb[2], 0);
}

ggml_tensor * pyqsa_qsa_attn_cells(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                   ggml_tensor * cells, float kq_scale) {
    const int64_t D        = q->ne[0];
    const int64_t n_head   = q->ne[1];
    const int64_t n_stream = k->ne[3];
    const int64_t n_tps    = q->ne[2] / n_stream;

    ggml_tensor * out = pyqsa_ggml_qsa_attn(ctx, pyqsa_q_by_stream(ctx, q, n_stream), k, v, cells, kq_scale);
    return ggml_reshape_2d(ctx, out, D * n_head, n_tps * n_stream);
}

ggml_tensor * pyqsa_qsa_sparse_attn(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k,
                                    ggml_tensor * v, ggml_tensor * mask, int64_t n_sel,
                                    float kq_scale) {
    return pyqsa_qsa_attn_cells(ctx, q, k, v, pyqsa_ggml_qsa_mask_cells(ctx, mask, n_sel), kq_scale);
}
