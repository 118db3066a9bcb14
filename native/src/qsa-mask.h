// QSA block selection for the masked attention path (graph builder, ggml API only).
//
// Called from the qwen4exp graph (ggml_patches/0002) in place of upstream's token-level top-k:
// HF's reference keeps the top budget/r whole *blocks* by score (lower block index wins ties)
// plus the incomplete tail block, while upstream kept the top budget+r-1 *tokens*.
#pragma once

#include "ggml.h"

#include <cstdint>

struct pyqsa_qsa_selection {
    ggml_tensor * blocks;  // I32 [kb, n_tps, n_stream]: selected block ids per query
    ggml_tensor * mask;    // F32 [n_kv, n_tps, 1, n_stream]: 0 = attend, -inf = skip
};

// score:    F32 [n_blocks, n_tps, n_stream] indexer score per (block, query)
// comp:     F32 [n_blocks, n_tps, n_stream] 0 where the block is complete and wholly visible to
//           the query (a top-k candidate), -inf elsewhere
// force:    F32 [n_blocks, n_tps, n_stream] 0 where the block is always kept (the query's tail
//           block, later blocks and the spare block of unpooled cells; kq_mask drops the cells
//           the query must not see), -inf elsewhere
// cell_blk: I32 [n_kv, n_stream] block id of every cache cell
// kq_mask:  [n_kv, n_tps, 1, n_stream] the causal/sequence attention mask (F32 or F16)
// kb:       blocks to keep per query, min(budget / r, n_blocks)
pyqsa_qsa_selection pyqsa_qsa_select_blocks(ggml_context * ctx, ggml_tensor * score,
                                            ggml_tensor * comp, ggml_tensor * force,
                                            ggml_tensor * cell_blk, ggml_tensor * kq_mask,
                                            int64_t kb);

// q F32 [D, n_head, n_tokens] (n_tokens = n_tps * n_stream, stream-major) as [D, n_head, n_tps,
// n_stream]: a view, no copy (the QSA ops read q through its row strides)
ggml_tensor * pyqsa_q_by_stream(ggml_context * ctx, ggml_tensor * q, int64_t n_stream);

// Attention over per-query cell lists, in the layout upstream's build_attn_mha returns.
//   q:     F32 [D, n_head, n_tokens] (n_tokens = n_tps * n_stream, stream-major)
//   k, v:  [D, n_head_kv, n_kv, n_stream] views of the KV cache, one row per (head, cell)
//   cells: I32 [n_sel, n_tps, n_stream]
// returns F32 [D * n_head, n_tokens]
ggml_tensor * pyqsa_qsa_attn_cells(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                   ggml_tensor * cells, float kq_scale);

// pyqsa_qsa_attn_cells over the cells a selection mask keeps.
//   mask: [n_kv, n_tps, 1, n_stream] from pyqsa_qsa_select_blocks
//   n_sel: bound on the kept cells per query (budget + ratio - 1, at most n_kv)
ggml_tensor * pyqsa_qsa_sparse_attn(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k,
                                    ggml_tensor * v, ggml_tensor * mask, int64_t n_sel,
                                    float kq_scale);
