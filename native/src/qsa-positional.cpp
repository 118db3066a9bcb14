// The positional QSA path (see qsa-positional.h).
#include "qsa-positional.h"

#include "pyqsa-error.h"
#include "pyqsa-ggml.h"
#include "qsa-mask.h"

#include "llama-batch.h"
#include "llama-kv-cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace {

pyqsa_kv_pager * pager_of(const llama_memory_hybrid_idx_context * mctx) {
    return mctx->get_attn()->get_pyqsa_pager();
}

// the tokens a ubatch has of each of its sequences (split_equal gives them all as many)
int64_t tokens_per_stream(const llama_ubatch & ubatch) {
    return ubatch.n_tokens / std::max<uint32_t>(1, ubatch.n_seqs_unq);
}

// a paged ubatch resolves through the hot cache when the hot cache can hold every block its
// queries select (decode, short drafts); longer ones (prefill chunks) read the host store
bool resolves(const pyqsa_kv_pager * pager, const llama_ubatch & ubatch, uint32_t r) {
    return pager != nullptr && tokens_per_stream(ubatch) * pager->blocks_selected(r) <= pager->hot_blocks();
}

// the streams a ubatch's cache views span (a sequence per stream, seq id == stream)
int64_t stream_span(const llama_ubatch & ubatch) {
    const auto ids = std::minmax_element(ubatch.seq_id_unq, ubatch.seq_id_unq + ubatch.n_seqs_unq);
    return ubatch.n_seqs_unq == 0 ? 1 : *ids.second - *ids.first + 1;
}

// a paged ubatch that does not resolve reads each layer's history from a prefetch area when the
// spanned streams' n_kv cells each fit (and its chunks are long enough, see prefetch_min_tokens);
// else the host store comes through the staging windows
bool prefetches(const pyqsa_kv_pager * pager, const llama_ubatch & ubatch, uint32_t r, int64_t n_kv) {
    return pager != nullptr && !resolves(pager, ubatch, r) && pager->prefetch_rows() > 0 &&
           stream_span(ubatch) * n_kv <= pager->prefetch_rows() &&
           tokens_per_stream(ubatch) >= pager->prefetch_min_tokens();
}

}  // namespace

pyqsa_qsa_positional_input::pyqsa_qsa_positional_input(const llama_memory_hybrid_idx_context * mctx,
                                                       const llama_ubatch & ubatch, uint32_t r, int64_t kv_size) :
    r(r), kv_size(kv_size), n_slot(n_slots(ubatch, r)), pager(pager_of(mctx)), resolve(resolves(pager, ubatch, r)),
    n_kv_attn(mctx->get_attn()->get_n_kv()), prefetch(prefetches(pager, ubatch, r, n_kv_attn)), mctx(mctx),
    n_kv(mctx->get_idx()->get_n_kv()) {}

int64_t pyqsa_qsa_positional_input::n_slots(const llama_ubatch & ubatch, uint32_t r) {
    // a stream with t consecutive tokens completes at most t / r + 1 blocks
    const int64_t n = ubatch.n_tokens;
    return std::min<int64_t>(n, (n + r - 1) / r + ubatch.n_seqs_unq);
}

void pyqsa_qsa_positional_input::set_input(const llama_ubatch * ubatch) {
    mctx->get_idx()->set_input_k_idxs(k_idxs, ubatch);

    GGML_ASSERT(ggml_backend_buffer_is_host(k_idxs->buffer));
    const int64_t * rows = (const int64_t *) k_idxs->data;
    int32_t *       pos  = (int32_t *) q_pos->data;
    int32_t *       vis  = (int32_t *) n_vis->data;

    int64_t s0 = INT64_MAX;
    for (uint32_t i = 0; i < ubatch->n_tokens; ++i) {
        s0 = std::min(s0, rows[i] / kv_size);
    }

    // the first token's stream (local to the ubatch's streams) and its last position in it
    const int64_t local0 = rows[0] / kv_size - s0;
    llama_pos     last0  = ubatch->pos[0];

    int32_t * comp_row = (int32_t *) comp_rows->data;
    int64_t * dst      = (int64_t *) comp_dst->data;
    int32_t * rope_pos = (int32_t *) comp_pos->data;
    int64_t   c        = 0;
    for (uint32_t i = 0; i < ubatch->n_tokens; ++i) {
        const llama_pos p    = ubatch->pos[i];
        const int64_t   cell = rows[i] % kv_size;
        pos[i]               = p;
        // the whole path rests on this: a cell is found from a position, never by a scan. A batch
        // that breaks it (a sequence not started at 0, a gap) gets safe inputs for that token, no
        // visible block and no block key, and an error for the caller instead of an abort.
        if (cell != p) {
            pyqsa_error_set("pyqsa: the QSA positional path needs cell index == position: position %d of the "
                            "batch went to cell %lld (a sequence must start at 0 and grow without gaps)",
                            (int) p, (long long) cell);
            vis[i] = 0;
            continue;
        }
        vis[i] = (p + 1) / (llama_pos) r;
        const int64_t local = rows[i] / kv_size - s0;
        if (local == local0) {
            last0 = std::max(last0, p);
        }
        if ((p + 1) % (llama_pos) r != 0) {
            continue;
        }
        const int64_t b0 = p + 1 - r;  // first cell of the completed block
        GGML_ASSERT(c < n_slot);
        for (uint32_t t = 0; t < r; ++t) {
            comp_row[c * r + t] = (int32_t) raw_row(local, b0 + t);
        }
        dst[c] = key_row(local, b0 / r);  // block b's key goes to row b (see the header)
        for (int sec = 0; sec < 4; ++sec) {
            rope_pos[sec * n_slot + c] = (int32_t) b0;
        }
        ++c;
    }
    if (pager != nullptr) {
        set_paging_input(*ubatch, rows, s0);
    }

    // Idle slots write into a row nobody reads: once the first token's stream has n >= 1
    // complete blocks, row n (the next block key's row; its raw key, in a complete block, is
    // pooled already); before that, the cell after the stream's last token, which that token's
    // own raw key overwrites before any read. With paging, block keys have rows of their own:
    // row n, not visible before its block completes. r == 1 has no idle slots (n_slots ==
    // n_tokens).
    const int64_t n_done0  = (last0 + 1) / (llama_pos) r;
    const int64_t idle_dst = pager != nullptr ? key_row(local0, n_done0)
                                              : key_row(local0, n_done0 >= 1 ? n_done0 : last0 + 1);
    for (; c < n_slot; ++c) {
        for (uint32_t t = 0; t < r; ++t) {
            comp_row[c * r + t] = (int32_t) raw_row(local0, ubatch->pos[0]);
        }
        dst[c] = idle_dst;
        for (int sec = 0; sec < 4; ++sec) {
            rope_pos[sec * n_slot + c] = ubatch->pos[0];
        }
    }
}

void pyqsa_qsa_positional_input::set_paging_input(const llama_ubatch & ubatch, const int64_t * rows, int64_t s0) {
    const int64_t S   = pager->slots(r);
    const int64_t W   = pager->ring();
    const int64_t ns  = step->ne[0] - 1;
    const int64_t n   = ubatch.n_tokens;

    // the first position of every stream of the ubatch: blocks below it / r are in the host store
    std::vector<llama_pos> first(ns, std::numeric_limits<llama_pos>::max());
    for (int64_t i = 0; i < n; ++i) {
        const int64_t s = rows[i] / kv_size - s0;
        GGML_ASSERT(s >= 0 && s < ns);
        first[s] = std::min(first[s], ubatch.pos[i]);
    }
    int64_t * ring  = (int64_t *) ring_rows->data;
    int64_t * raw   = (int64_t *) key_ring_rows->data;
    // a prefetching chunk reads no stored-block count, so its graph has no n_paged to set
    int32_t * paged = prefetch ? nullptr : (int32_t *) n_paged->data;
    int64_t * area  = prefetch ? (int64_t *) area_rows->data : nullptr;
    for (int64_t i = 0; i < n; ++i) {
        const llama_pos p = ubatch.pos[i];
        const int64_t   s = rows[i] / kv_size - s0;
        // the ring holds the stream's cells from its first block not in the store on
        GGML_ASSERT(p - first[s] + first[s] % (llama_pos) r < W);
        ring[i]  = s * (S * r + W) + S * r + p % W;
        raw[i]   = raw_row(s, p);
        if (paged != nullptr) {
            paged[i] = first[s] / (llama_pos) r;
        }
        if (area != nullptr) {
            GGML_ASSERT(p < n_kv_attn);
            area[i] = s * n_kv_attn + p;
        }
    }

    // a stream starting a sequence, or whose hot slots a prefill chunk stages into, starts a new
    // generation: its next resolve empties its page state (a prefetching chunk leaves the hot
    // slots alone). Only graphs that resolve read (and so allocate) the step input.
    std::vector<int32_t> & gen = pager->generation(r);
    int32_t *              st  = resolve ? (int32_t *) step->data : nullptr;
    for (int64_t s = 0; s < ns; ++s) {
        gen[s0 + s] += first[s] == 0 || (!resolve && !prefetch);
        if (st != nullptr) {
            st[1 + s] = gen[s0 + s];
        }
    }
    if (st != nullptr) {
        st[0] = pager->next_step();
    }
    pager->count_written((uint64_t) n * bytes_per_token);
    if (prefetch) {  // every layer of ratio r copies n_kv rows of each of its view's streams
        const uint64_t rows = (uint64_t) stream_span(ubatch) * n_kv_attn;
        pager->count_prefetched(rows / r * pager->n_layers(r), rows * bytes_per_token);
    }
}

int64_t pyqsa_qsa_positional_input::rows_per_stream() const {
    return pager != nullptr ? pager->kv_size() / r + pager->ring() : kv_size;
}

int64_t pyqsa_qsa_positional_input::raw_row(int64_t local, llama_pos p) const {
    return local * rows_per_stream() + (pager != nullptr ? pager->kv_size() / r + p % pager->ring() : p);
}

int64_t pyqsa_qsa_positional_input::key_row(int64_t local, int64_t b) const {
    return local * rows_per_stream() + b;
}

bool pyqsa_qsa_positional_input::can_reuse(const llm_graph_params & params) {
    mctx = static_cast<const llama_memory_hybrid_idx_context *>(params.mctx);
    return mctx->get_idx() != nullptr && k_idxs->ne[0] == params.ubatch.n_tokens &&
           n_slots(params.ubatch, r) == n_slot && (int64_t) mctx->get_idx()->get_n_kv() == n_kv &&
           pager_of(mctx) == pager && resolves(pager, params.ubatch, r) == resolve &&
           (int64_t) mctx->get_attn()->get_n_kv() == n_kv_attn &&
           prefetches(pager, params.ubatch, r, n_kv_attn) == prefetch;
}

namespace {

// Writes this ubatch's completed block keys and selects, per query, the top budget/r visible
// blocks plus the tail.
//   table: F32 [Di, rows] the indexer rows of the ubatch's streams (inp->rows_per_stream() per
//          stream) after this ubatch's raw keys: the indexer cache, or with paging the pager's
//          block keys and raw-key ring
//   n_kv:  the indexer cache's cells in use (n_blocks = n_kv / r rounded up are scored)
//   q:     F32 [Di, n_idx_head, n_tokens] indexer queries, normed and roped
// returns I32 [kb, n_tps, n_stream] the selected blocks
ggml_tensor * select_blocks(ggml_context * ctx, ggml_cgraph * gf, pyqsa_qsa_positional_input * inp, ggml_tensor * table,
                            int64_t n_kv, int64_t ns, ggml_tensor * q, const pyqsa_qsa_rope & rope, int64_t budget,
                            ggml_tensor ** score_out) {
    const int64_t Di       = q->ne[0];
    const int64_t n_tokens = q->ne[2];
    const int64_t r        = inp->r;
    const int64_t stride   = inp->rows_per_stream();
    const size_t  row      = table->nb[1];

    GGML_ASSERT(table->type == GGML_TYPE_F32 && table->ne[0] == Di);
    GGML_ASSERT(n_tokens % ns == 0);

    // [Di, r * n_slot] -> [Di, 1, n_slot] the mean over the r members of each block, as one
    // average pool (two launches where the copies, adds and scale took 2r + 1); it sums the
    // members in order and divides by r, so for r a power of two (the models' 4) the bits are those
    // of adding the members one by one and scaling by 1/r, on the CPU and on CUDA
    ggml_tensor * members = ggml_get_rows(ctx, table, inp->comp_rows);
    members = ggml_reshape_3d(ctx, members, Di, r, inp->n_slot);
    ggml_tensor * pooled = ggml_pool_2d(ctx, members, GGML_OP_POOL_AVG, 1, (int) r, 1, (int) r, 0.0f, 0.0f);
    pooled = ggml_mul(ctx, ggml_rms_norm(ctx, pooled, rope.eps), rope.k_norm);
    pooled = ggml_rope_multi(ctx, ggml_reshape_3d(ctx, pooled, Di, 1, inp->n_slot), inp->comp_pos, nullptr,
                             rope.n_rot, rope.sections, rope.mode, rope.n_ctx_orig, rope.freq_base,
                             rope.freq_scale, rope.ext_factor, rope.attn_factor, rope.beta_fast, rope.beta_slow);
    // reads of the block keys below go through this node, so they see this ubatch's blocks
    table = ggml_set_rows(ctx, table, ggml_reshape_2d(ctx, pooled, Di, inp->n_slot), inp->comp_dst);
    ggml_build_forward_expand(gf, table);

    // block b's key sits in row b of its stream: [Di, n_blocks, ns], contiguous per stream
    const int64_t n_blocks = (n_kv + r - 1) / r;
    ggml_tensor * keys = ggml_view_3d(ctx, table, Di, n_blocks, ns, row, stride * row, 0);

    // sum over heads of ReLU(q_h . k_b), / sqrt(Di) as the reference does: [n_blocks, n_tps, ns]
    const float   scale = 1.0f / std::sqrt((float) Di);
    // tokens are stream-major in the ubatch, so q splits into [.., n_tps, ns] in place
    ggml_tensor * q4 = pyqsa_q_by_stream(ctx, q, ns);
    ggml_tensor * summed = pyqsa_ggml_qsa_score(ctx, q4, keys, scale);
    *score_out = summed;

    const int64_t kb = std::min<int64_t>(budget / r, n_blocks);
    return pyqsa_ggml_qsa_topk(ctx, summed, inp->n_vis, kb);
}

// one layer's K/V cache rows as attention reads them: [D, n_head_kv, rows, ns]
ggml_tensor * as_heads(ggml_context * ctx, ggml_tensor * rows2d, const ggml_tensor * like, int64_t n_rows, int64_t ns) {
    return ggml_view_4d(ctx, rows2d, like->ne[0], like->ne[1], n_rows, ns, ggml_row_size(rows2d->type, like->ne[0]),
                        rows2d->nb[1], n_rows * rows2d->nb[1], 0);
}

// The first of the ubatch's streams (they are consecutive), as llama.cpp's cache views of layer il
// have it: the index of its rows in the pager's per-stream tensors.
int64_t first_stream(const pyqsa_qsa_graph & g, const pyqsa_kv_pager_layer & l, int32_t il) {
    return g.mctx->get_attn()->get_k(g.ctx, il)->view_offs / l.host_k->nb[2];
}

// Queues the bulk copy of paged layer il's stored rows [0, n_kv) of the ubatch's streams into
// its prefetch area, after `after` (the last reader of that area in this graph, if any).
void fetch_layer(const pyqsa_qsa_graph & g, pyqsa_qsa_positional_input * inp, int32_t il, ggml_tensor * after) {
    const pyqsa_kv_pager_layer & l  = *inp->pager->layer(il);
    const int64_t                s0 = first_stream(g, l, il);
    const int64_t                ns = stream_span(g.ubatch), n_kv = inp->n_kv_attn;
    ggml_tensor * area[2];
    int           j = 0;
    for (ggml_tensor * a : { l.area_k, l.area_v }) {
        area[j++] = ggml_view_3d(g.ctx, a, a->ne[0], n_kv, ns, a->nb[1], n_kv * a->nb[1], 0);
    }
    ggml_tensor * f = pyqsa_ggml_qsa_page_fetch(g.ctx, area[0], (const char *) l.host_k->data + s0 * l.host_k->nb[2],
                                                area[1], (const char *) l.host_v->data + s0 * l.host_v->nb[2],
                                                inp->pager->kv_size(), after);
    ggml_format_name(f, "qsa_prefetch-%d", il);
    ggml_build_forward_expand(g.gf, f);
    inp->fetches[il] = f;
}

// The paged attention of one layer (see qsa-pager.h)
ggml_tensor * attend_paged(const pyqsa_qsa_graph & g, pyqsa_qsa_positional_input * inp, const pyqsa_kv_pager_layer & l,
                           ggml_tensor * k_idxs, ggml_tensor * v_idxs, ggml_tensor * q, ggml_tensor * k_cur,
                           ggml_tensor * v_cur, ggml_tensor * blocks, int il, float kq_scale) {
    ggml_context * ctx = g.ctx;
    const pyqsa_kv_pager & pager = *inp->pager;
    const int64_t r      = inp->r;
    const int64_t H      = pager.hot_blocks();
    const int64_t S      = pager.slots(r);
    const int64_t n_rows = S * r + pager.ring();
    const int64_t ns     = blocks->ne[2];
    const int64_t n_tok  = k_cur->ne[2];
    const int64_t s0     = first_stream(g, l, il);

    // the ubatch's K/V: into the ring, and from there to the host store
    ggml_tensor * dev[2]  = { l.dev_k, l.dev_v };
    ggml_tensor * cur[2]  = { k_cur, v_cur };
    ggml_tensor * ring[2];
    for (int i = 0; i < 2; ++i) {
        ggml_tensor * rows2d = ggml_view_2d(ctx, dev[i], dev[i]->ne[0], ns * n_rows, dev[i]->nb[1], s0 * dev[i]->nb[2]);
        ring[i] = ggml_set_rows(ctx, rows2d, ggml_reshape_2d(ctx, cur[i], dev[i]->ne[0], n_tok), inp->ring_rows);
        ggml_build_forward_expand(g.gf, ring[i]);
    }
    // to the rows llama.cpp's cache indices name (cell == position); a store of another type than
    // the device rows (q8_0 beside f16) is written from the f32 rows, quantized as unpaged
    const bool    convert = l.host_k->type != l.dev_k->type;
    ggml_tensor * write   = convert ? pyqsa_ggml_qsa_page_write(ctx, ggml_reshape_2d(ctx, k_cur, l.host_k->ne[0], n_tok),
                                                                ggml_reshape_2d(ctx, v_cur, l.host_v->ne[0], n_tok),
                                                                nullptr, k_idxs, v_idxs, l.host_k->data, l.host_v->data)
                                    : pyqsa_ggml_qsa_page_write(ctx, ring[0], ring[1], inp->ring_rows, k_idxs, v_idxs,
                                                                l.host_k->data, l.host_v->data);
    pyqsa_ggml_qsa_page_set_store_type(write, l.host_k->type);
    ggml_build_forward_expand(g.gf, write);

    const char *  store_k = (const char *) l.host_k->data + s0 * l.host_k->nb[2];
    const char *  store_v = (const char *) l.host_v->data + s0 * l.host_v->nb[2];
    const int64_t n_store = pager.kv_size() / r;
    // the device rows as attention reads them: [D, n_head_kv, n_rows, ns]
    const auto    rows_k  = [&] { return as_heads(ctx, ring[0], k_cur, n_rows, ns); };
    const auto    rows_v  = [&] { return as_heads(ctx, ring[1], v_cur, n_rows, ns); };
    // the first n block slots as block rows: [r * E, n, ns]
    const auto    slots_of = [&](ggml_tensor * t, int64_t n) {
        return ggml_view_3d(ctx, t, r * t->ne[0], n, ns, r * t->nb[1], n_rows * t->nb[1], 0);
    };
    if (inp->resolve) {
        const auto state = [&](ggml_tensor * t) {
            return ggml_view_2d(ctx, t, t->ne[0], ns, t->nb[1], s0 * t->nb[1]);
        };
        ggml_tensor * slots = pyqsa_ggml_qsa_page_resolve(ctx, blocks, inp->n_paged, state(l.table), state(l.owner),
                                                          state(l.stamp), inp->step, state(l.stats),
                                                          slots_of(ring[0], H), store_k, slots_of(ring[1], H), store_v,
                                                          n_store);
        pyqsa_ggml_qsa_page_set_store_type(slots, l.host_k->type);
        pyqsa_ggml_qsa_page_resolve_set_generations(slots, ggml_view_1d(ctx, l.seen, ns, s0 * l.seen->nb[0]));
        ggml_tensor * cells = pyqsa_ggml_qsa_block_cells_paged(ctx, blocks, slots, inp->n_vis, inp->n_paged, inp->q_pos,
                                                               (int32_t) r, (int32_t) (S * r), (int32_t) pager.ring());
        ggml_format_name(cells, "qsa_paged_cells-%d", il);
        return pyqsa_qsa_attn_cells(ctx, q, rows_k(), rows_v(), cells, kq_scale);
    }

    if (inp->prefetch) {
        // The fetch queued two layers back (or at this graph's first layer) brings the stored
        // rows; with the chunk's own rows added, the area is the unpaged cache of these streams
        // (cell == position), and the unpaged attention reads it: the same kernels, the same bits.
        ggml_tensor * f = inp->fetches.at(il);
        GGML_ASSERT(f->src[0]->ne[2] == ns);
        ggml_tensor * cells = pyqsa_ggml_qsa_block_cells(ctx, blocks, inp->n_vis, inp->q_pos, (int32_t) r);
        ggml_format_name(cells, "qsa_cells-%d", il);
        ggml_tensor * kv[2];
        for (int i = 0; i < 2; ++i) {
            ggml_tensor * area = pyqsa_ggml_qsa_page_fetch_wait(ctx, f, f->src[i]);
            area  = ggml_reshape_2d(ctx, area, area->ne[0], area->ne[1] * area->ne[2]);
            kv[i] = ggml_set_rows(ctx, area, ggml_reshape_2d(ctx, cur[i], area->ne[0], n_tok), inp->area_rows);
        }
        const int64_t n_kv = inp->n_kv_attn;
        ggml_tensor * out  = pyqsa_qsa_attn_cells(ctx, q, as_heads(ctx, kv[0], k_cur, n_kv, ns),
                                                  as_heads(ctx, kv[1], v_cur, n_kv, ns), cells, kq_scale);
        const int32_t next = pager.layer_after(il, 2);  // the next layer of this area pair
        if (next >= 0) {
            fetch_layer(g, inp, next, out);
        }
        return out;
    }

    // A prefill chunk: the host store comes through the block slots a window of S blocks at a time
    // (only the blocks some query selects), each window followed by a resumable attention pass
    // over the cells in it; the ring's cells come last. Passes keep qsa_attn's order and splits,
    // so the result has its bits. The hot cache is forgotten (set_input starts a new generation).
    ggml_tensor * cells = pyqsa_ggml_qsa_block_cells(ctx, blocks, inp->n_vis, inp->q_pos, (int32_t) r);
    ggml_format_name(cells, "qsa_cells-%d", il);
    const int64_t D = q->ne[0], n_head = q->ne[1];
    ggml_tensor * q4 = pyqsa_q_by_stream(ctx, q, ns);
    // the ubatch's streams hold at most n_kv cells, so their stored blocks lie below n_kv / r
    const int64_t n_kv      = g.mctx->get_attn()->get_n_kv();
    const int64_t n_windows = ((n_kv + r - 1) / r + S - 1) / S;
    // every pass reads its own views of the device rows: a backend that cannot run the pass (a
    // head size CUDA lacks) gets a copy of its inputs, and the scheduler copies a tensor once
    // per graph, so a shared view would show later passes the first window. The staging op
    // writes in place, so one view of what it writes serves every window.
    ggml_tensor * stage_k = slots_of(ring[0], S);
    ggml_tensor * stage_v = slots_of(ring[1], S);
    ggml_tensor * tally   = ggml_view_1d(ctx, l.staged, ns, s0 * l.staged->nb[0]);
    ggml_tensor * state   = nullptr;
    for (int64_t w = 0; w < n_windows; ++w) {
        ggml_tensor * staged = pyqsa_ggml_qsa_page_stage(ctx, blocks, inp->n_paged, stage_k, store_k, stage_v, store_v,
                                                         n_store, w * S, state, tally);
        pyqsa_ggml_qsa_page_set_store_type(staged, l.host_k->type);
        state = pyqsa_ggml_qsa_attn_part(ctx, q4, rows_k(), rows_v(), cells, inp->n_paged, state, staged, kq_scale,
                                         (int32_t) r, (int32_t) (w * S * r), (int32_t) ((w + 1) * S * r), 0, 0, false);
    }
    ggml_tensor * out = pyqsa_ggml_qsa_attn_part(ctx, q4, rows_k(), rows_v(), cells, inp->n_paged, state, nullptr,
                                                 kq_scale, (int32_t) r, 0, 0, (int32_t) (S * r), (int32_t) pager.ring(),
                                                 true);
    return ggml_reshape_2d(ctx, out, D * n_head, n_tok);
}

}  // namespace

bool pyqsa_qsa_positional_applies(const llama_cparams & cparams) {
    return cparams.pyqsa.qsa_mode == PYQSA_QSA_POSITIONAL && cparams.flash_attn && cparams.causal_attn;
}

ggml_tensor * pyqsa_qsa_positional_top_k(const pyqsa_qsa_graph & g, pyqsa_qsa_positional_input *& inp, int il,
                                         uint32_t r, ggml_tensor * k_raw, ggml_tensor * q,
                                         const pyqsa_qsa_rope & rope, int64_t budget, ggml_tensor ** score_out) {
    const llama_kv_cache_context * idx = g.mctx->get_idx();
    const int64_t n_tokens = g.ubatch.n_tokens;

    // the layer's indexer cache; a view, so it reads what cpy_k below writes
    ggml_tensor * k_view = idx->get_k(g.ctx, il);
    if (inp == nullptr) {
        auto p       = std::make_unique<pyqsa_qsa_positional_input>(g.mctx, g.ubatch, r, k_view->nb[3] / k_view->nb[2]);
        p->k_idxs    = idx->build_input_k_idxs(g.ctx, g.ubatch);
        p->q_pos     = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n_tokens);
        p->n_vis     = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n_tokens);
        p->comp_rows = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, r * p->n_slot);
        p->comp_dst  = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I64, p->n_slot);
        p->comp_pos  = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, 4 * p->n_slot);
        for (ggml_tensor * t : { p->q_pos, p->n_vis, p->comp_rows, p->comp_dst, p->comp_pos }) {
            ggml_set_input(t);
        }
        if (p->pager != nullptr) {
            const int64_t ns = k_view->ne[3];
            p->ring_rows     = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I64, n_tokens);
            p->key_ring_rows = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I64, n_tokens);
            p->n_paged       = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n_tokens);
            p->step          = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, 1 + ns);
            for (ggml_tensor * t : { p->ring_rows, p->key_ring_rows, p->n_paged, p->step }) {
                ggml_set_input(t);
            }
            if (p->prefetch) {
                p->area_rows = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I64, n_tokens);
                ggml_set_input(p->area_rows);
            }
            p->bytes_per_token = p->pager->bytes_per_token(r);
        }
        inp = p.get();
        g.res->add_input(std::move(p));
    }
    const int64_t n_kv = k_view->ne[2];
    const int64_t ns   = k_view->ne[3];
    const pyqsa_kv_pager_layer * l = inp->pager ? inp->pager->layer(il) : nullptr;
    if (l == nullptr) {
        ggml_build_forward_expand(g.gf, idx->cpy_k(g.ctx, k_raw, inp->k_idxs, il));
        // every row of the ubatch's streams, as one table: row = local stream * kv_size + cell
        ggml_tensor * table = ggml_view_2d(g.ctx, k_view, k_view->ne[0], (ns - 1) * inp->kv_size + n_kv, k_view->nb[2], 0);
        return select_blocks(g.ctx, g.gf, inp, table, n_kv, ns, q, rope, budget, score_out);
    }
    // paged: the pager's block keys and raw-key ring stand in for the indexer cache, which
    // nothing reads; k_idxs stays in the graph for set_input's rows
    ggml_build_forward_expand(g.gf, inp->k_idxs);
    if (inp->prefetch && inp->fetches.count(il) == 0) {
        // the first paged layer of its device in this graph: no attention read either area yet,
        // so both of its first layers' copies start here, before the indexer's work
        fetch_layer(g, inp, il, nullptr);
        const int32_t next = inp->pager->layer_after(il, 1);
        if (next >= 0) {
            fetch_layer(g, inp, next, nullptr);
        }
    }
    const int64_t s0     = k_view->view_offs / k_view->nb[3];
    const int64_t stride = inp->rows_per_stream();
    ggml_tensor * table  = ggml_view_2d(g.ctx, l->keys, l->keys->ne[0], ns * stride, l->keys->nb[1], s0 * l->keys->nb[2]);
    table = ggml_set_rows(g.ctx, table, ggml_reshape_2d(g.ctx, k_raw, k_raw->ne[0], n_tokens), inp->key_ring_rows);
    return select_blocks(g.ctx, g.gf, inp, table, n_kv, ns, q, rope, budget, score_out);
}

ggml_tensor * pyqsa_qsa_positional_attn(const pyqsa_qsa_graph & g, pyqsa_qsa_positional_input * inp, int il,
                                        ggml_tensor * k_idxs, ggml_tensor * v_idxs, ggml_tensor * q,
                                        ggml_tensor * k_cur, ggml_tensor * v_cur, ggml_tensor * blocks, float kq_scale) {
    const llama_kv_cache_context * kv = g.mctx->get_attn();
    const pyqsa_kv_pager_layer *   l  = inp->pager ? inp->pager->layer(il) : nullptr;
    if (l != nullptr) {
        return attend_paged(g, inp, *l, k_idxs, v_idxs, q, k_cur, v_cur, blocks, il, kq_scale);
    }
    ggml_build_forward_expand(g.gf, kv->cpy_k(g.ctx, k_cur, k_idxs, il));
    ggml_build_forward_expand(g.gf, kv->cpy_v(g.ctx, v_cur, v_idxs, il));
    ggml_tensor * cells = pyqsa_ggml_qsa_block_cells(g.ctx, blocks, inp->n_vis, inp->q_pos, (int32_t) inp->r);
    ggml_format_name(cells, "qsa_cells-%d", il);
    return pyqsa_qsa_attn_cells(g.ctx, q, kv->get_k(g.ctx, il), kv->get_v(g.ctx, il), cells, kq_scale);
}
