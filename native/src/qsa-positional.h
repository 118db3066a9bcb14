// The positional QSA path: block keys kept incrementally in the indexer cache and every
// per-ubatch host input O(n_tokens), valid while each KV stream holds one sequence whose cell
// index equals the token position (pyqsa's engine: one sequence per slot, never partly removed;
// set_input checks it for every token of every ubatch).
//
// Block keys: when a token completes block b (position b*r + r - 1), the block's r raw indexer
// keys are pooled, normed and roped once and the result goes to row b of the stream's indexer
// cache. Row b held the raw key of cell b, whose block (b / r) completed no later than block b
// did, so nothing reads it as a raw key again; raw keys of the incomplete tail sit at rows
// >= (complete blocks) * r, above every block key. So a stream's block keys are its first
// n_blocks rows, contiguous: scoring reads them in place, and a pager can keep that prefix apart
// from the tail. Only blocks below a query's n_vis = (pos + 1) / r compete in the top-k, so
// the scores of rows past the complete blocks are never used.
//
// The graph has a fixed number of completion slots per ubatch shape (n_slots), not one per
// block completed: a decode step that completes a block then has the same graph as one that
// does not, so llama.cpp reuses it (and the CUDA backend keeps its captured CUDA graph). Slots
// without a block pool a copy of the ubatch's first raw key into a dead row (see set_input).
#pragma once

#include "qsa-pager.h"

#include "llama-cparams.h"
#include "llama-graph.h"
#include "llama-memory-hybrid-idx.h"

#include <cstdint>
#include <map>

class pyqsa_qsa_positional_input : public llm_graph_input_i {
public:
    pyqsa_qsa_positional_input(const llama_memory_hybrid_idx_context * mctx, const llama_ubatch & ubatch,
                               uint32_t r, int64_t kv_size);

    void set_input(const llama_ubatch * ubatch) override;
    bool can_reuse(const llm_graph_params & params) override;

    // completion slots of a ubatch: at least the blocks its tokens can complete
    static int64_t n_slots(const llama_ubatch & ubatch, uint32_t r);

    ggml_tensor * k_idxs    = nullptr;  // I64 [n_tokens] indexer cache rows of the ubatch's raw keys
    ggml_tensor * q_pos     = nullptr;  // I32 [n_tokens] query positions (stream-major, as the ubatch)
    ggml_tensor * n_vis     = nullptr;  // I32 [n_tokens] complete blocks visible to each query
    ggml_tensor * comp_rows = nullptr;  // I32 [r * n_slot] rows of the completed blocks' raw keys
    ggml_tensor * comp_dst  = nullptr;  // I64 [n_slot] row receiving each block key (row b for block b)
    ggml_tensor * comp_pos  = nullptr;  // I32 [4 * n_slot] rope position of each block (its start)

    // paging (pager != nullptr): what the ubatch writes where, and what is already in the host store
    ggml_tensor * ring_rows     = nullptr;  // I64 [n_tokens] row of each token in the device cache view
    ggml_tensor * key_ring_rows = nullptr;  // I64 [n_tokens] row of each token's raw indexer key
    ggml_tensor * n_paged    = nullptr;  // I32 [n_tokens] blocks of the token's stream in the host store
    ggml_tensor * step       = nullptr;  // I32 [1 + n_stream] step number, then the streams to empty
    ggml_tensor * area_rows  = nullptr;  // I64 [n_tokens] row of each token in a prefetch area view

    const uint32_t r;
    const int64_t  kv_size;
    const int64_t  n_slot;

    pyqsa_kv_pager * const pager;  // the attention cache's pager, nullptr without paging
    const bool             resolve;  // paged and decode-shaped: selected blocks go through the hot cache
    const int64_t          n_kv_attn;  // cells in use per stream of the ubatch's streams (attention cache)
    // a paged prefill chunk whose streams' histories fit a prefetch area: each layer's stored
    // rows come to the device by a bulk copy overlapping the layers before it (qsa-pager.h)
    const bool             prefetch;
    std::map<int32_t, ggml_tensor *> fetches;  // paged layer -> its fetch node in the graph being built
    uint64_t bytes_per_token = 0;      // K/V bytes a token writes to the host store, all layers of ratio r

    // indexer rows of the ubatch's streams: each stream's block keys (row b), then its raw keys
    // (row p in the cache; with paging, a ring after the block keys)
    int64_t rows_per_stream() const;
    int64_t raw_row(int64_t local_stream, llama_pos p) const;
    int64_t key_row(int64_t local_stream, int64_t block) const;

private:
    void set_paging_input(const llama_ubatch & ubatch, const int64_t * rows, int64_t s0);

    const llama_memory_hybrid_idx_context * mctx;
    int64_t n_kv;
};

// Indexer parameters of one layer for pooling block keys (RMSNorm weight and the layer's rope).
struct pyqsa_qsa_rope {
    ggml_tensor * k_norm;
    float         eps;
    int           n_rot;
    int *         sections;
    int           mode;
    int           n_ctx_orig;
    float         freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
};

// Whether a context's QSA layers take the positional path: its qsa_mode asks for it, and the
// V cache is in rows (flash attention on) with causal attention.
bool pyqsa_qsa_positional_applies(const llama_cparams & cparams);

// What the positional path needs of the graph being built (llm_graph_context's members).
struct pyqsa_qsa_graph {
    ggml_context *                          ctx;
    ggml_cgraph *                           gf;
    llm_graph_result *                      res;
    const llama_memory_hybrid_idx_context * mctx;
    const llama_ubatch &                    ubatch;
    uint32_t                                n_layer;
};

// One indexed layer's selection on the positional path: stores the ubatch's raw indexer keys,
// writes its completed block keys and selects, per query, the top budget/r visible blocks plus
// the tail. inp is the graph's input set for ratio r (layers sharing a ratio share it): created
// and registered with g.res when null.
//   k_raw: F32 [Di, 1, n_tokens] raw indexer keys of the ubatch's tokens
//   q:     F32 [Di, n_idx_head, n_tokens] indexer queries, normed and roped
// returns I32 [kb, n_tps, n_stream] the selected blocks of every query (pyqsa_ggml_qsa_topk);
// *score_out the block scores [n_blocks, n_tps, n_stream]
ggml_tensor * pyqsa_qsa_positional_top_k(const pyqsa_qsa_graph & g, pyqsa_qsa_positional_input *& inp, int il,
                                         uint32_t r, ggml_tensor * k_raw, ggml_tensor * q,
                                         const pyqsa_qsa_rope & rope, int64_t budget, ggml_tensor ** score_out);

// One indexed layer's attention on the positional path, after pyqsa_qsa_positional_top_k:
// stores the ubatch's K/V (in the cache, or with paging in the ring and the host store) and
// attends to each query's selected blocks plus its tail.
//   q, k_cur, v_cur: [D, n_head(_kv), n_tokens] as build_attn takes them
//   k_idxs, v_idxs:  the attention input's cache rows of the ubatch (unpaged stores)
//   blocks:          I32 [kb, n_tps, n_stream] from pyqsa_qsa_positional_top_k
// returns F32 [D * n_head, n_tokens]
ggml_tensor * pyqsa_qsa_positional_attn(const pyqsa_qsa_graph & g, pyqsa_qsa_positional_input * inp, int il,
                                        ggml_tensor * k_idxs, ggml_tensor * v_idxs, ggml_tensor * q,
                                        ggml_tensor * k_cur, ggml_tensor * v_cur, ggml_tensor * blocks, float kq_scale);
