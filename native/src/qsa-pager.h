// Host-backed KV paging of the indexed (QSA) layers.
//
// With paging on (pyqsa_context_config::hot_blocks > 0), llama.cpp's K/V cache of these layers
// is allocated in the device's pinned host memory (the host store: cell == position, so block b
// of stream s is r contiguous rows), and the pager keeps per layer, on the device, one tensor of
// S*r + W rows per stream: S block slots, the first H of them the hot cache (the blocks recent
// steps selected), and a ring of W cells holding the newest positions (position p at row
// S*r + p % W, W >= n_ubatch + r - 1). A step writes its tokens' K/V to the ring and, through
// the ring, to the host store; a decode step resolves its selected blocks to hot slots
// (pyqsa_ggml_qsa_page_resolve: misses fetched from the host store, LRU eviction, state on the
// device); a prefill chunk, whose queries select more distinct blocks than the hot cache holds,
// brings the host store through all S slots a window at a time (pyqsa_ggml_qsa_page_stage,
// pyqsa_ggml_qsa_attn_part). S = H unless the context would take more than max_stage_windows
// windows. The indexer keeps on the device only the block keys and a ring of raw keys (the
// indexer cache proper moves to host memory, reserved but never written). See native/PAGING.md.
#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

struct llama_model;

struct pyqsa_kv_layer_tensors {
    int32_t       il;
    ggml_tensor * k;  // llama.cpp's cache tensors of the layer: [E, kv_size, n_stream]
    ggml_tensor * v;
};

struct pyqsa_kv_pager_layer {
    uint32_t      r;       // compress ratio: cells per block
    int64_t       kb;      // blocks one query selects
    ggml_tensor * host_k;  // the host store (llama.cpp's cache tensors, in pinned host memory)
    ggml_tensor * host_v;
    ggml_tensor * dev_k;   // [E, S*r + W, n_stream]: block slots (the first H hot), then the ring
    ggml_tensor * dev_v;
    ggml_tensor * table;   // I32 [kv_size / r, n_stream] block -> hot slot, -1 = not resident
    ggml_tensor * owner;   // I32 [H, n_stream] hot slot -> block, -1 = free
    ggml_tensor * stamp;   // I32 [H, n_stream] step of the slot's last use
    ggml_tensor * stats;   // I64 [2, n_stream] hits, misses
    ggml_tensor * staged;  // I64 [n_stream] blocks staged for prefill chunks
    ggml_tensor * seen;    // I32 [n_stream] the generation each stream's page state belongs to
    ggml_tensor * keys;    // F32 [Di, kv_size / r + W, n_stream] the indexer rows the positional path
                           // reads: block keys (row b), then a ring of raw keys (row kv_size / r + p % W)
    // the prefetch area this layer's prefill chunks read (one of two, the paged layers of a
    // device taking them in turn): [E, kv_size] of K and of V; nullptr when prefetch is off
    ggml_tensor * area_k;
    ggml_tensor * area_v;
};

// hits and misses of the hot caches, and the bytes moved each way over the host link
struct pyqsa_kv_pager_counters {
    uint64_t hits, misses, staged, bytes_to_device, bytes_to_host;
    std::vector<std::array<uint64_t, 3>> layers;  // per paged layer: il, hits, misses
};

class pyqsa_kv_pager {
public:
    pyqsa_kv_pager(const llama_model & model, const std::vector<pyqsa_kv_layer_tensors> & layers,
                   uint32_t n_stream, uint32_t kv_size, int64_t hot_blocks, int64_t ring, int32_t hot_type);
    ~pyqsa_kv_pager();

    const pyqsa_kv_pager_layer * layer(int32_t il) const;  // nullptr: not paged

    // a prefill chunk's graph passes over the host store in at most this many windows
    static constexpr int64_t max_stage_windows = 64;

    int64_t hot_blocks() const { return H; }
    // rows of each prefetch area: a prefill chunk whose streams hold n_kv cells each takes the
    // prefetch path when n_stream * n_kv fits (0: prefetch off, PYQSA_PAGING_PREFETCH=0)
    int64_t prefetch_rows() const { return area_rows; }
    // a chunk of fewer tokens a stream than this takes the staged windows (PYQSA_PAGING_PREFETCH_MIN_TOKENS)
    int64_t prefetch_min_tokens() const { return area_min_tokens; }
    // the paged layer k places after il among those of its device, -1 if none: with k == 2, the
    // next layer whose prefetch area il's attention was the last to read (the paged layers then
    // share one ratio: prefetch is off otherwise)
    int32_t layer_after(int32_t il, int k) const;
    int64_t ring() const { return W; }
    // block slots per stream of the layers of ratio r: the H hot ones, more when a prefill
    // chunk's windows need them (kv_size / r blocks in max_stage_windows windows)
    int64_t slots(uint32_t r) const { return std::max<int64_t>(H, (n_cells / r + max_stage_windows - 1) / max_stage_windows); }
    int64_t kv_size() const { return n_cells; }

    // a step number for the resolve ops of one graph; later calls get larger ones
    int32_t next_step();

    int64_t  blocks_selected(uint32_t r) const;  // kb of the layers of ratio r
    int64_t  n_layers(uint32_t r) const;         // paged layers of ratio r
    uint64_t bytes_per_token(uint32_t r) const;  // K/V bytes of one token in the host store, all layers of ratio r

    // each stream's generation for the layers of ratio r: a new one whenever its hot caches stop
    // matching their page tables (a new sequence, a prefill chunk staged over them); a resolve
    // empties a stream's state when it last saw another (pyqsa_ggml_qsa_page_resolve_set_generations)
    std::vector<int32_t> & generation(uint32_t r);

    void count_written(uint64_t bytes) { written += bytes; }
    // a prefetching graph's copies, counted when its inputs are set (the copies are in its graph)
    void count_prefetched(uint64_t blocks, uint64_t bytes) {
        prefetched_blocks += blocks;
        prefetched_bytes += bytes;
    }

    // stream dst becomes a copy of stream src (llama_kv_cache's cross-stream seq_cp): hot
    // caches, rings and page tables; the hit/miss counters stay each stream's own
    void copy_stream(uint32_t src, uint32_t dst);

    // what the pager's buffers hold: hot caches with their page state (and the buffers' padding),
    // block slots past them that only prefill staging uses, the rings (tail), the indexer rows
    enum class part { hot, staging, tail, keys };
    std::map<ggml_backend_buffer_type_t, size_t> memory_breakdown(part what) const;
    pyqsa_kv_pager_counters  counters() const;  // reads the device's hit/miss counters (syncs)

private:
    std::map<int32_t, pyqsa_kv_pager_layer> layers;
    std::map<uint32_t, std::vector<int32_t>> generations;
    std::vector<ggml_backend_buffer_t>      buffers;
    std::vector<ggml_context *>             ctxs;
    // by buffer type, the bytes of each part but hot (which is what the buffers hold besides)
    std::map<ggml_backend_buffer_type_t, std::array<size_t, 4>> part_bytes;
    int64_t  H, W, n_cells, area_rows = 0, area_min_tokens = 0;
    uint32_t n_stream;
    int32_t  step = 0;
    uint64_t written = 0;
    uint64_t prefetched_blocks = 0, prefetched_bytes = 0;
};

// Hooks in llama_kv_cache's constructor (ggml_patches/0009). The buffer type of layer il's K/V
// when the context being built pages: for the attention cache (name_tag ""), the device's pinned
// host buffer type (the host store); for the indexer cache ("idx_"), host memory (the pager's
// device rows replace it); else buft.
ggml_backend_buffer_type_t pyqsa_kv_cache_buft(const llama_model & model, int32_t il, ggml_backend_buffer_type_t buft,
                                               const char * name_tag);

// The pager of a cache just allocated, or nullptr when the context being built does not page it.
std::shared_ptr<pyqsa_kv_pager> pyqsa_kv_pager_create(const llama_model & model, const char * name_tag,
                                                      uint32_t n_stream, uint32_t kv_size,
                                                      const std::vector<pyqsa_kv_layer_tensors> & layers);
