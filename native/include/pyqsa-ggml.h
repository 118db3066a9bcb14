// pyqsa ggml ops: graph constructors for the ops in native/ggml (exported from ggml-base).
//
// All share one ggml op, GGML_OP_PYQSA (ggml_patches/0005), with the sub-op in op_params[0];
// each backend dispatches on it (native/ggml/cpu/pyqsa-cpu.cpp, native/ggml/cuda/pyqsa-cuda.cu).
#pragma once

#include "ggml.h"
#include "pyqsa.h"

#ifdef __cplusplus
extern "C" {
#endif

enum pyqsa_ggml_op {
    PYQSA_GGML_OP_QSA_ATTN       = 1,
    PYQSA_GGML_OP_QSA_MASK_CELLS = 2,
    PYQSA_GGML_OP_QSA_TOPK       = 3,
    PYQSA_GGML_OP_QSA_BLOCK_CELLS = 4,
    PYQSA_GGML_OP_QSA_SCORE      = 5,
    PYQSA_GGML_OP_QSA_PAGE_RESOLVE = 6,
    PYQSA_GGML_OP_QSA_PAGE_WRITE = 7,
    PYQSA_GGML_OP_QSA_PAGE_STAGE = 8,
    PYQSA_GGML_OP_QSA_ATTN_PART  = 9,
    PYQSA_GGML_OP_SAMPLE         = 10,
    PYQSA_GGML_OP_QSA_PAGE_FETCH = 11,
    PYQSA_GGML_OP_QSA_PAGE_FETCH_WAIT = 12,
    PYQSA_GGML_OP_HC_COMBINE     = 13,
    PYQSA_GGML_OP_SILU_SCALED    = 14,
    PYQSA_GGML_OP_GDN_GATES      = 15,
    PYQSA_GGML_OP_ADD_GATED      = 16,
    PYQSA_GGML_OP_CONV_STEP      = 17,
    PYQSA_GGML_OP_RMS_NORM_GATED = 18,
    PYQSA_GGML_OP_HC_DOWN        = 19,
    PYQSA_GGML_OP_HC_PRE         = 20,
};

// Sparse attention: every query attends only to the KV cells listed for it (QSA: the selected
// blocks plus the tail), softmax(scale * q.k) over those cells, weighted sum of v.
//   q:     F32 [D, n_head, n_q, n_stream]
//   k, v:  F32, F16 or Q8_0 [D, n_head_kv, n_kv, n_stream], one contiguous row per (head, cell)
//          (views of the KV cache); n_head % n_head_kv == 0 (GQA)
//   cells: I32 [n_sel, n_q, n_stream] cell indices into k/v ne[2], each at most once per query;
//          negative = unused slot
// returns F32 [D, n_head, n_q, n_stream]; a query with no listed cell gets zeros
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_attn(struct ggml_context * ctx,
                                                  struct ggml_tensor * q,
                                                  struct ggml_tensor * k,
                                                  struct ggml_tensor * v,
                                                  struct ggml_tensor * cells,
                                                  float scale);

// Cell lists from a selection mask: per query row, the indices of the finite mask entries in
// increasing order, padded with -1.
//   mask:  F32 or F16 [n_kv, n_tps, 1, n_stream] (0 = attend, -inf = skip)
// returns I32 [n_sel, n_tps, n_stream]; rows with more than n_sel finite entries keep the first
// n_sel (the caller sizes n_sel to the selection's bound, budget + ratio - 1)
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_mask_cells(struct ggml_context * ctx,
                                                        struct ggml_tensor * mask,
                                                        int64_t n_sel);

// QSA indexer scores of every block key in one pass, in f32 on every backend (the indexer keys
// are kept f32 so that near ties resolve as in f32):
//   score[b, t, s] = scale * sum over h of ReLU(q[:, h, t, s] . keys[:, b, s])
//   q:    F32 [D, n_head, n_tps, n_stream], rows contiguous (nb[0] = 4)
//   keys: F32 [D, n_blocks, n_stream], rows contiguous (the block-key prefix of each stream)
// returns F32 [n_blocks, n_tps, n_stream]; heads are added in order 0..n_head-1 after the ReLU,
// then the sum is scaled. One op for decode and prefill, so a chunk's [n_blocks, n_head, n_tps]
// product is never materialized. CUDA takes D = 32, 64, 128, 256 or 512 (the CPU kernel any D):
// calls of fewer than PYQSA_GGML_QSA_SCORE_CUDA_MMA_MIN_TPS queries per stream (decode) read each
// key once with f32 FMAs; more (prefill chunks) run on tensor cores when D <= 256 and n_head is
// 1, 2, 4 or 8 (f16 hi/lo splits of q and keys, f32 accumulators: the CPU's scores to f32
// rounding, not its bits; identical keys still tie exactly). Other shapes with many queries take
// the decode kernel, correct but slow.
#define PYQSA_GGML_QSA_SCORE_CUDA_MMA_MIN_TPS 17

GGML_API struct ggml_tensor * pyqsa_ggml_qsa_score(struct ggml_context * ctx,
                                                   struct ggml_tensor * q,
                                                   struct ggml_tensor * keys,
                                                   float scale);

// Top-k block selection with a deterministic order: the k largest scores of each row, exact
// ties going to the lower index (HF's reference leaves tie order to torch.topk; pyqsa fixes it
// so CPU and CUDA agree bit for bit). -inf scores take part like any other value.
//   score: F32 [n, n_rows...] contiguous rows
//   n_vis: optional I32 [n_rows]: only the first n_vis[row] entries of a row are candidates
//          (the others count as -inf)
// returns I32 [k, n_rows...]: the selected indices of each row in increasing index order
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_topk(struct ggml_context * ctx,
                                                  struct ggml_tensor * score,
                                                  struct ggml_tensor * n_vis,
                                                  int64_t k);

// Cell lists of a block selection when cell index == position (one sequence per KV stream):
// the r cells of every selected block below n_vis, then the query's tail cells
// n_vis*r .. pos, padded with -1.
//   blocks: I32 [kb, n_q, n_stream] from pyqsa_ggml_qsa_topk
//   n_vis:  I32 [n_q * n_stream] complete blocks visible to each query, (pos + 1) / r
//   pos:    I32 [n_q * n_stream] position of each query
// returns I32 [kb * r + r - 1, n_q, n_stream]
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_block_cells(struct ggml_context * ctx,
                                                         struct ggml_tensor * blocks,
                                                         struct ggml_tensor * n_vis,
                                                         struct ggml_tensor * pos,
                                                         int32_t r);

// pyqsa_ggml_qsa_block_cells for a paged KV cache whose device copy is a hot cache of
// hot_cells / r block slots followed by a ring of `ring` cells holding the newest positions
// (position p at row hot_cells + p % ring): blocks below n_paged (written to the host store
// before this step) are read from their hot slot, cell slot*r + t; later blocks and the tail
// from the ring. The ring must hold every position from n_paged*r to the query.
//   slots:   I32 [kb, n_q, n_stream] hot slot of each selected block (pyqsa_ggml_qsa_page_resolve
//            with n_paged as its n_vis)
//   n_paged: I32 [n_q * n_stream] blocks of each query's stream in the host store
// returns I32 [kb * r + r - 1, n_q, n_stream] rows of the device cache, padded with -1
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_block_cells_paged(struct ggml_context * ctx,
                                                               struct ggml_tensor * blocks,
                                                               struct ggml_tensor * slots,
                                                               struct ggml_tensor * n_vis,
                                                               struct ggml_tensor * n_paged,
                                                               struct ggml_tensor * pos,
                                                               int32_t r,
                                                               int32_t hot_cells,
                                                               int32_t ring);

// Host-backed KV paging, one step of one indexed layer: maps every selected block to a slot of
// its stream's hot cache (a small device copy of the blocks in use), fetching the blocks that
// are not resident from the host store. Eviction is LRU with the step's own selection pinned:
// the misses, in increasing block order, take the unpinned slots in increasing (last use,
// slot) order, free slots first, which is what evicting one least-recently-used slot per miss
// would do. State lives in the src tensors and is updated in place, on the device, so a step
// needs no host sync.
//   blocks: I32 [kb, n_q, n_stream] selected block ids (pyqsa_ggml_qsa_topk)
//   n_vis:  I32 [n_q * n_stream] visible complete blocks per query; blocks >= n_vis are not
//           selected (top-k pads with them) and map to -1
//   table:  I32 [n_blocks, n_stream] (state) logical block -> hot slot, -1 = not resident
//   owner:  I32 [H, n_stream] (state) hot slot -> logical block, -1 = free
//   stamp:  I32 [H, n_stream] (state) step of the slot's last use, -1 = never
//   step:   I32 [1] or [1 + n_stream]: this step's number, larger than every earlier call's, then
//           (with pyqsa_ggml_qsa_page_resolve_set_generations) each stream's generation
//   stats:  I64 [2, n_stream] (state) hits, misses: selected entries whose block was resident,
//           and blocks fetched
//   hot:    [E, H, n_stream] any type, one contiguous row of B = nb[1] bytes per block, streams
//           nb[2] apart (a view of a larger device cache may be given) (state)
//   store:  host memory the kernel reads directly (pinned, zero-copy on CUDA): block b of stream
//           s is the B bytes at store + (s * n_store + b) * B; not a graph tensor, so no
//           backend copies it. The caller keeps it written before the step that reads it.
//   hot_v, store_v: optional second pair (a block's V rows, kept apart from its K rows as
//           llama.cpp's caches keep them), fetched with the first; NULL for none
// H must hold every distinct block one step selects (H >= kb * n_q); n_blocks <= n_store.
// returns I32 [kb, n_q, n_stream]: the hot slot of every selected block, -1 where not visible
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_page_resolve(struct ggml_context * ctx,
                                                          struct ggml_tensor * blocks,
                                                          struct ggml_tensor * n_vis,
                                                          struct ggml_tensor * table,
                                                          struct ggml_tensor * owner,
                                                          struct ggml_tensor * stamp,
                                                          struct ggml_tensor * step,
                                                          struct ggml_tensor * stats,
                                                          struct ggml_tensor * hot,
                                                          const void * store,
                                                          struct ggml_tensor * hot_v,
                                                          const void * store_v,
                                                          int64_t n_store);

// Prefill staging of one window of a host store: per stream, every block b in [b0, b0 + S) below
// n_paged that some query selects is copied to slot b - b0 of a staging area (the other slots
// keep what they held). Windows taken in turn, each followed by a pyqsa_ggml_qsa_attn_part pass,
// bring a prefill chunk's stored blocks to the device a window at a time.
//   blocks:  I32 [kb, n_q, n_stream] selected block ids (pyqsa_ggml_qsa_topk)
//   n_paged: I32 [n_q * n_stream] blocks of each query's stream in the host store
//   stage:   [E, S, n_stream] any type, one contiguous row of B = nb[1] bytes per block, streams
//            nb[2] apart (a view of a larger tensor may be given); written in place
//   store, stage_v, store_v, n_store: as for pyqsa_ggml_qsa_page_resolve
//   after:   optional node this one must follow (the previous pass, which read the staging area)
//   tally:   optional I64 [n_stream] (state): each stream's copied blocks are added to it
// returns I32 [n_stream]: the blocks each stream copied
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_page_stage(struct ggml_context * ctx,
                                                        struct ggml_tensor * blocks,
                                                        struct ggml_tensor * n_paged,
                                                        struct ggml_tensor * stage,
                                                        const void * store,
                                                        struct ggml_tensor * stage_v,
                                                        const void * store_v,
                                                        int64_t n_store,
                                                        int64_t b0,
                                                        struct ggml_tensor * after,
                                                        struct ggml_tensor * tally);

// The split count of pyqsa_ggml_qsa_attn on CUDA (the CPU kernel keeps one split): a query's
// list of n_sel cells is cut into this many equal runs, each with its own online softmax, merged
// at the end.
// On CUDA (sm_80 or later) calls with f16 K/V run on tensor cores, prefill chunks and decode steps
// alike; PYQSA_QSA_ATTN_MMA=0 in the environment keeps every call on the CUDA-core kernel, the one
// pyqsa_ggml_qsa_attn_part reproduces bit for bit.
static inline int pyqsa_ggml_qsa_attn_cuda_splits(int64_t n_sel, int64_t n_rows, int64_t n_head) {
    const int64_t ctas = n_rows * n_head > 0 ? n_rows * n_head : 1;
    const int64_t by_cells = (n_sel + 63) / 64, by_ctas = 4096 / ctas;
    const int64_t n = by_cells < by_ctas ? by_cells : by_ctas;
    return n > 1 ? (int) n : 1;
}

// One pass of a resumable pyqsa_ggml_qsa_attn, for prefill over a paged cache: each query's
// online-softmax state (per split: acc, max, sum) comes from the previous pass, takes the cells
// of its list inside this pass's positions and goes on to the next pass. Every backend splits a
// list as its qsa_attn does, so passes over increasing, disjoint position ranges that cover every
// listed cell give the bits of that backend's qsa_attn (cell lists are in increasing position
// order apart from -1 padding) — on CUDA, of its CUDA-core kernel (PYQSA_QSA_ATTN_MMA=0): the
// passes do not reproduce the tensor-core rounding of a qsa_attn call with f16 K/V (the same
// values to f32 rounding, not the same bits).
//   q, cells: as for pyqsa_ggml_qsa_attn, cells being positions (pyqsa_ggml_qsa_block_cells)
//   n_paged:  I32 [n_q * n_stream] blocks of each query's stream in the host store
//   k, v:     [D, n_head_kv, n_rows, n_stream] this pass's rows
//   state:    F32 [D + 2, n_head, n_q * n_stream, S] the previous pass (S: the most splits a
//             backend uses, pyqsa_ggml_qsa_attn_cuda_splits), NULL for the first
//   stored pass (ring == 0): positions [lo, hi) below n_paged * r, position c at row c - lo
//   ring pass (ring > 0): positions from n_paged * r on, position c at row base + c % ring
//   after:    optional node this one must follow (the staging that wrote k/v)
// returns the next state, or with last the attention output F32 [D, n_head, n_q, n_stream]
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_attn_part(struct ggml_context * ctx,
                                                       struct ggml_tensor * q,
                                                       struct ggml_tensor * k,
                                                       struct ggml_tensor * v,
                                                       struct ggml_tensor * cells,
                                                       struct ggml_tensor * n_paged,
                                                       struct ggml_tensor * state,
                                                       struct ggml_tensor * after,
                                                       float scale,
                                                       int32_t r,
                                                       int32_t lo,
                                                       int32_t hi,
                                                       int32_t base,
                                                       int32_t ring,
                                                       bool last);

// Generations for a page-resolve node whose step input has 1 + n_stream entries: a stream whose
// generation (step[1 + s]) differs from seen[s] empties its table, owners and stamps first, and
// seen[s] takes the generation. The caller starts a new generation whenever a stream's hot
// cache no longer holds what its table says (a new sequence, a prefill that staged over it);
// a step that never ran (an aborted decode) leaves seen behind, so the next one still empties.
//   seen: I32 [n_stream] (state)
GGML_API void pyqsa_ggml_qsa_page_resolve_set_generations(struct ggml_tensor * resolve, struct ggml_tensor * seen);

// The host stores of a page-resolve, page-stage or page-write node hold another type than its
// device rows: a q8_0 store beside f16 rows (half the bytes over the host link, f16 attention).
// Resolve and stage dequantize each fetched block into f16 (d * q in f32, rounded to nearest);
// the write quantizes f32 rows (then its k and v are F32, and src_rows may be NULL: row i) into
// q8_0 blocks as the backend's set_rows does. Call right after the node's constructor.
GGML_API void pyqsa_ggml_qsa_page_set_store_type(struct ggml_tensor * op, enum ggml_type type);

// The type of a page node's host stores: its device rows' type unless set otherwise.
GGML_API enum ggml_type pyqsa_ggml_qsa_page_store_type(const struct ggml_tensor * op);

// The device rows of a page node: what a resolve or stage fills, what a write reads.
GGML_API const struct ggml_tensor * pyqsa_ggml_qsa_page_rows(const struct ggml_tensor * op);

// Bytes of one row of a page node's host store: for resolve and stage a block (the device rows'
// ne[0] elements), for the write a row of k.
GGML_API size_t pyqsa_ggml_qsa_page_store_row(const struct ggml_tensor * op);

// Store i (0: store, 1: store_v) of a page-resolve or page-stage node and its blocks per stream.
GGML_API const void * pyqsa_ggml_qsa_page_store(const struct ggml_tensor * op, int i, int64_t * n_store);

// Write-back to the host store: copies row src_rows[i] of k to row k_rows[i] of the K store
// (the B = k->nb[1] bytes at k_host + k_rows[i] * B) and of v to row v_rows[i] of the V store,
// written by the backend in stream order, so a later node or graph that reads the store sees
// them.
//   k, v:           [E, n_rows] any type, rows contiguous (e.g. the ring of a device cache)
//   src_rows:       I64 [n] rows of k/v
//   k_rows, v_rows: I64 [n] rows of the stores (llama.cpp's cache indices); negative: skip
//   (with a store type of its own, see pyqsa_ggml_qsa_page_set_store_type, src_rows may be NULL)
// returns I32 [1], a node to expand (its value means nothing)
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_page_write(struct ggml_context * ctx,
                                                        struct ggml_tensor * k,
                                                        struct ggml_tensor * v,
                                                        struct ggml_tensor * src_rows,
                                                        struct ggml_tensor * k_rows,
                                                        struct ggml_tensor * v_rows,
                                                        void * k_host,
                                                        void * v_host);

// Prefill prefetch of a host store: rows [0, n_rows) of every stream's K and V store, copied to a
// device area as they lie (cell == position), so a prefill chunk attends over its streams' whole
// history with the unpaged kernels. On CUDA the copy runs on a copy stream of its own (the copy
// engine, bulk DMA of pinned memory), ordered after the nodes already queued, and overlaps the
// nodes that follow until pyqsa_ggml_qsa_page_fetch_wait joins it; the CPU copies in place.
//   dst, dst_v:   [E, n_rows, n_stream] any type, rows and streams contiguous (an area view);
//                 written in place, valid only after the wait
//   store, store_v: host memory: row c of stream s at store + (s * store_rows + c) * B, B = dst->nb[1]
//   after:        optional node the copy must follow (the last reader of the area)
// returns I32 [1], the handle pyqsa_ggml_qsa_page_fetch_wait takes (its value means nothing)
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_page_fetch(struct ggml_context * ctx,
                                                        struct ggml_tensor * dst,
                                                        const void * store,
                                                        struct ggml_tensor * dst_v,
                                                        const void * store_v,
                                                        int64_t store_rows,
                                                        struct ggml_tensor * after);

// The point from which a fetch's area may be read: returns a view of area (dst or dst_v of the
// fetch) that every reader of the fetched rows must take.
GGML_API struct ggml_tensor * pyqsa_ggml_qsa_page_fetch_wait(struct ggml_context * ctx,
                                                             struct ggml_tensor * fetch,
                                                             struct ggml_tensor * area);

// Token sampling where the logits are: each row drawn by the rules of pyqsa_sample_params
// (pyqsa.h), so only the token and its log-probabilities leave the device.
//   logits: F32 [n_vocab, n_rows], rows contiguous
//   params: I32 [8, n_rows], one pyqsa_sample_params per row, bit for bit
//   adjust: I32 [4, max_adjust, n_rows], each row's pyqsa_logit_adjust list (ended by its first
//           negative id), bit for bit; NULL: none
// returns I32 [42, n_rows], one pyqsa_sample_result per row, bit for bit
GGML_API struct ggml_tensor * pyqsa_ggml_sample(struct ggml_context * ctx,
                                                struct ggml_tensor * logits,
                                                struct ggml_tensor * params,
                                                struct ggml_tensor * adjust);

// The same rules on one host row (the CPU kernel's work per row, and pyqsa_sample's), the row
// adjusted by the list adjust[0 .. n_adjust) ended early by a negative id.
GGML_API void pyqsa_sample_row(const float * logits, int64_t n_vocab, const struct pyqsa_sample_params * params,
                               const struct pyqsa_logit_adjust * adjust, int64_t n_adjust,
                               struct pyqsa_sample_result * out);

// The combine of hyper-connections (qwen4exp's build_hc_combine) in one op: each of the hc
// residual streams adds the block's output, scaled by its own weight 2 * sigmoid(scale * inject):
//   out[e, c, t] = x[e, t] * (2 * sigmoid(scale * inject[c, t])) + residual[e, c, t]
//   x:        F32 [n_embd, n_tokens] (the block's output)
//   residual: F32 [n_embd, hc, n_tokens] (the streams)
//   inject:   F32 [hc, n_tokens] (the scatter logits)
// any strides, elements contiguous (nb[0] = 4); returns F32 [n_embd, hc, n_tokens]. Each step
// is rounded to f32 as the unfused ops round it (ggml_scale, ggml_sigmoid, ggml_scale by 2,
// ggml_dsv4_hc_post without comb), so on one backend the two agree bit for bit; one launch
// where they take four.
GGML_API struct ggml_tensor * pyqsa_ggml_hc_combine(struct ggml_context * ctx,
                                                    struct ggml_tensor * x,
                                                    struct ggml_tensor * residual,
                                                    struct ggml_tensor * inject,
                                                    float scale);

// SiLU of scaled inputs, silu(scale * x), as one op (qwen4exp's hyper-connection gate,
// silu(lo / hc)):
//   x: F32, rows contiguous (nb[0] = 4), any shape
// returns F32 of x's shape, contiguous. Each step rounded as ggml_scale then ggml_silu round it
// (on the CPU through the same vectorized SiLU over each row), so on one backend the two agree
// bit for bit.
GGML_API struct ggml_tensor * pyqsa_ggml_silu_scaled(struct ggml_context * ctx,
                                                     struct ggml_tensor * x,
                                                     float scale);

// The linear attention's two gates in one op (qwen4exp's Gated DeltaNet):
//   out[h, t, s, 0] = softplus(alpha[h, t, s] + dt_bias[h]) * a[h]   (the decay, log space)
//   out[h, t, s, 1] = sigmoid(beta[h, t, s])                          (the write strength)
//   alpha, beta:  F32 [H, T, S], elements contiguous (nb[0] = 4), any row strides
//   dt_bias, a:   F32 [H], contiguous
// returns F32 [H, T, S, 2], contiguous: each half is what ggml_gated_delta_net takes as its g or
// beta (a view of [1, H, T, S]). Each step rounded as upstream's ggml_add, ggml_softplus,
// ggml_mul and ggml_sigmoid round it, so on one backend the op and those ops agree bit for bit;
// one launch where they take three or four.
GGML_API struct ggml_tensor * pyqsa_ggml_gdn_gates(struct ggml_context * ctx,
                                                   struct ggml_tensor * alpha,
                                                   struct ggml_tensor * beta,
                                                   struct ggml_tensor * dt_bias,
                                                   struct ggml_tensor * a);

// A sigmoid-gated add with one gate a row (qwen4exp's shared expert joining the routed ones):
//   out[i, r] = base[i, r] + x[i, r] * sigmoid(g[0, r])
//   base, x: F32 [n, rows], elements contiguous (nb[0] = 4), any row strides
//   g:       F32 [1, rows]
// returns F32 [n, rows], contiguous. The sigmoid, the product and the sum each rounded to f32 as
// ggml_sigmoid, ggml_mul and ggml_add round them (no FMA), so on one backend the op and those
// ops agree bit for bit; one launch where they take three.
GGML_API struct ggml_tensor * pyqsa_ggml_add_gated(struct ggml_context * ctx,
                                                   struct ggml_tensor * base,
                                                   struct ggml_tensor * x,
                                                   struct ggml_tensor * g);

// The combine of hyper-connections of a block whose output is a sigmoid-gated add, in one op:
// pyqsa_ggml_hc_combine's out with its x[e, t] the join base[e, t] + x[e, t] * sigmoid(g[0, t])
// (qwen4exp's MoE: the routed experts' sum and the shared expert's gated output). base and x as
// pyqsa_ggml_add_gated's, residual and inject as pyqsa_ggml_hc_combine's. Each step rounded as
// those two ops round it, so it agrees with them (and with upstream's seven ops) bit for bit on
// one backend; one launch where they take two, and no tensor for the join.
GGML_API struct ggml_tensor * pyqsa_ggml_hc_combine_gated(struct ggml_context * ctx,
                                                          struct ggml_tensor * base,
                                                          struct ggml_tensor * x,
                                                          struct ggml_tensor * g,
                                                          struct ggml_tensor * residual,
                                                          struct ggml_tensor * inject,
                                                          float scale);

// A decode step of the linear attention's causal convolution (one token a sequence), its SiLU and
// the store of the state the next step reads, in one op:
//   win[., c, s]  = (state[0 .. K-2, c, s], x[c, 0, s])                 (K values)
//   out[c, 0, s]  = silu(sum over j of win[j, c, s] * kernel[j, c])
//   store[j + c * (K-1), s] = win[j + 1, c, s]                          (j < K-1)
//   state:  F32 [K-1, C, S], contiguous (the rows gathered from the cache, not the cache itself)
//   x:      F32 [C, 1, S], elements contiguous (the step's projected input)
//   kernel: F32 [K, C], contiguous
//   store:  F32 [(K-1) * C, S], rows contiguous (the sequences' rows of the cache; written)
// returns F32 [C, 1, S], contiguous. The sum in ggml_ssm_conv's order and the SiLU as ggml_silu
// computes it (on the CPU the same vectorized SiLU over each row), so on one backend the op gives
// the bits of upstream's concat, ssm_conv, silu and the copy of the state's tail; one launch
// where they take three.
GGML_API struct ggml_tensor * pyqsa_ggml_conv_step(struct ggml_context * ctx,
                                                   struct ggml_tensor * state,
                                                   struct ggml_tensor * x,
                                                   struct ggml_tensor * kernel,
                                                   struct ggml_tensor * store);

// An RMS norm with its weight and a sigmoid gate, one op (qwen4exp's gated norm of the linear
// attention's output, norm(core_attn_out) * sigmoid(z)):
//   out[i, r] = (x[i, r] * rsqrt(mean over i of x[., r]^2 + eps)) * w[i] * sigmoid(z[i, r])
//   x, z: F32 of one shape, rows of n contiguous (nb[0] = 4), any row strides; w: F32 [n]
// returns F32 of x's shape, contiguous. Each backend sums the squares and rounds each step as
// its own rms_norm (fused with the weight on CUDA: upstream's block reduction, called from the
// same header), sigmoid and mul do, so on one backend the op and upstream's ops agree bit for
// bit; one launch where they take two (three on the CPU's graph).
GGML_API struct ggml_tensor * pyqsa_ggml_rms_norm_gated(struct ggml_context * ctx,
                                                        struct ggml_tensor * x,
                                                        struct ggml_tensor * w,
                                                        struct ggml_tensor * z,
                                                        float eps);

// The mix of hyper-connections at a decode step (qwen4exp's build_hc_mix with its inject) in two
// ops where upstream's graph has five: HC_DOWN the grouped RMS norm with its products down and
// inject, HC_PRE the gate's product up with the sigmoid-gated mean over the streams. With
// xn[e, c, t] = x[e, c, t] * rsqrt(mean over e of x[., c, t]^2 + eps) * w_norm[e, c] and xn's
// [hc * n_embd, n_tokens] view xv:
//   pyqsa_ggml_hc_down returns F32 [(lr + 2 hc) n_tokens], three contiguous blocks:
//     lo     [lr, n_tokens] at 0:              silu(scale * (w_down^T xv))  (the gate's input)
//     inject [hc, n_tokens] at lr n_tokens:    w_inject^T xv  (the scatter logits, for hc_combine)
//     factor [hc, n_tokens] after inject:      each stream's rsqrt factor (read by hc_pre)
//   pyqsa_ggml_hc_pre returns F32 [n_embd, n_tokens]:
//     out[e, t] = scale * sum over c of xn[e, c, t] * sigmoid((w_up^T lo[., t])[e + c n_embd])
//   x:        F32 [n_embd, hc, n_tokens], contiguous (the residual streams)
//   w_norm:   F32 [n_embd, hc], contiguous
//   w_down:   [hc n_embd, lr] of a type pyqsa_hc_weight_type takes; w_inject: the same type,
//             [hc n_embd, hc]
//   w_up:     [lr, hc n_embd] of a type pyqsa_hc_weight_type takes
//   down:     pyqsa_ggml_hc_down's result for these x and w_norm
// The products sum in f32 from f32 inputs (quantized weights dequantized; CUDA rounds each to f16
// once) where upstream's CPU products round xn to f16 (or 8 bits) first: the two ways agree to
// rounding, not bit for bit. CUDA takes up to PYQSA_HC_MIX_MAX_TOKENS tokens (a decode step's
// sequences), PYQSA_HC_MIX_MAX_STREAMS streams, even n_embd and lr; quantized weights (those of
// its gemv) at one token, n_embd and lr multiples of 8.
#define PYQSA_HC_MIX_MAX_TOKENS  8
#define PYQSA_HC_MIX_MAX_STREAMS 4
// the weights' types of the mix: F32, F16, or quantized with a dequantizer
GGML_API bool pyqsa_hc_weight_type(enum ggml_type type);
GGML_API struct ggml_tensor * pyqsa_ggml_hc_down(struct ggml_context * ctx,
                                                 struct ggml_tensor * x,
                                                 struct ggml_tensor * w_norm,
                                                 struct ggml_tensor * w_down,
                                                 struct ggml_tensor * w_inject,
                                                 float eps,
                                                 float scale);

GGML_API struct ggml_tensor * pyqsa_ggml_hc_pre(struct ggml_context * ctx,
                                                struct ggml_tensor * x,
                                                struct ggml_tensor * w_norm,
                                                struct ggml_tensor * w_up,
                                                struct ggml_tensor * down,
                                                float scale);

// Host address i (0 or 1) that a pyqsa op keeps in its params from index first_param on.
GGML_API void * pyqsa_ggml_host_ptr(const struct ggml_tensor * op, int first_param);

#ifdef __cplusplus
}
#endif
