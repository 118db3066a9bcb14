// A sequence's state as a head and rows (see pyqsa_seq_state_save in pyqsa.h).
//
// The head is llama.cpp's own per-sequence state of the hybrid memory (the QSA layers' K/V cells,
// the Gated DeltaNet recurrent and conv states, the indexer cells), written through pyqsa's io
// classes with every per-position payload left out (the rows), then, with paging, the pager's
// ring rows of the incomplete tail block that llama.cpp does not know of.
//
// Layout: header | llama.cpp's state without rows | pager tail rows | series table.
// A series is one tensor's run of rows as the head's writer met it: llama.cpp's K and V cells (a
// row per position; cell == position, checked on save), llama.cpp's indexer cells, then per paged
// layer the pager's block keys. Block keys are a row per r positions: block b's, written once
// the block is complete. The unpaged indexer cache holds them too, in its rows 0..n/r-1 (over raw
// keys no block needs any more), and the raw keys of the incomplete tail block in rows
// n/r*r..n-1: the first are its series, the second go into the head where the writer met them
// (the rows in between are read by nothing). With paging the K/V cells are the host store, and the
// indexer cache is the unread lazily committed buffer: its rows are left out on save and not
// written on load (writing would commit its pages). A load or a resume starts the stream's next
// page-state generation: the hot cache it held belongs to another sequence (or to later positions).
#include "pyqsa.h"

#include "llama-context.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid-idx.h"
#include "llama-model.h"
#include "qsa-pager.h"
#include "seq-state-io.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

using namespace pyqsa_seq_state;

namespace {

llama_memory_hybrid_idx * hybrid_of(llama_context * ctx) {
    return dynamic_cast<llama_memory_hybrid_idx *>(llama_get_memory(ctx));
}

// one contiguous run of rows of stream s of a [E, rows, n_stream] tensor
struct rows_run {
    ggml_tensor * t;
    size_t        offset, size;
};

// the pager's ring rows a sequence of n tokens in stream s needs: per paged layer the tail's raw
// keys, then its K, then its V (a ring row per position, wrapping), each as runs of consecutive
// rows, so a head's tail is a few copies per layer, not three per position
std::vector<rows_run> tail_rows(const llama_model & model, const pyqsa_kv_pager & pager, uint32_t s, uint32_t n) {
    std::vector<rows_run> runs;
    const int64_t         W = pager.ring();
    for (int32_t il = 0; il < (int32_t) model.hparams.n_layer(); ++il) {
        const pyqsa_kv_pager_layer * l = pager.layer(il);
        if (l == nullptr) {
            continue;
        }
        const int64_t n_key0 = pager.kv_size() / l->r;    // the key ring's first row
        const int64_t n_ring = pager.slots(l->r) * l->r;  // the K/V ring's first row
        const std::pair<ggml_tensor *, int64_t> rings[] = { { l->keys, n_key0 }, { l->dev_k, n_ring },
                                                            { l->dev_v, n_ring } };
        for (const auto & [t, row0] : rings) {
            for (int64_t p = (n / l->r) * l->r; p < n;) {
                const int64_t at = p % W, len = std::min<int64_t>(n - p, W - at);
                runs.push_back({ t, s * t->nb[2] + (row0 + at) * t->nb[1], (size_t) len * t->nb[1] });
                p += len;
            }
        }
    }
    return runs;
}

// per paged layer, in layer order, the series of its block keys in stream s (rows 0..n/r-1)
std::vector<series> block_keys(const llama_model & model, const pyqsa_kv_pager & pager, uint32_t s) {
    std::vector<series> out;
    for (int32_t il = 0; il < (int32_t) model.hparams.n_layer(); ++il) {
        if (const pyqsa_kv_pager_layer * l = pager.layer(il)) {
            out.push_back({ l->keys, s * l->keys->nb[2], { l->keys->nb[1], 0, l->r, 0 } });
        }
    }
    return out;
}

void next_generation(const llama_model & model, pyqsa_kv_pager & pager, int32_t seq_id) {
    std::set<uint32_t> ratios;
    for (int32_t il = 0; il < (int32_t) model.hparams.n_layer(); ++il) {
        if (const pyqsa_kv_pager_layer * l = pager.layer(il)) {
            ratios.insert(l->r);
        }
    }
    for (uint32_t ratio : ratios) {
        pager.generation(ratio)[seq_id] += 1;  // its next resolve empties the stream's hot cache
    }
}

}  // namespace

struct pyqsa_seq_rows {
    uint32_t            n_tokens;
    std::vector<series> s;
};

struct pyqsa_rows_reader {
    std::unique_ptr<ggml_backend, decltype(&ggml_backend_free)> queue;  // freed after r
    rows_reader                                                 r;
};

struct pyqsa_seq_stage {
    stage             s;
    std::atomic<bool> busy{ false };  // staged by a save, not filled yet
};

namespace {

// one sequence's bytes of the recurrent memory's tensors (a cell each; a cell per sequence)
size_t recurrent_bytes(const llama_memory_hybrid & mem, const std::set<const ggml_tensor *> & recurrent) {
    size_t bytes = 0;
    for (const ggml_tensor * t : recurrent) {
        bytes += ggml_nbytes(t) / mem.get_mem_recr()->size;
    }
    return bytes;
}

// what a head of n positions is likely to take: the recurrent state, and a few dozen bytes of
// cell metadata per position (grown past it when not)
size_t head_estimate(const llama_memory_hybrid & mem, const std::set<const ggml_tensor *> & recurrent, uint32_t n) {
    return (1u << 20) + recurrent_bytes(mem, recurrent) + (size_t) n * 64;
}

// the most bytes of rows a head copies beside its recurrent state: the tail block's raw keys of
// each indexer layer, and with paging each paged layer's ring rows of the tail block (r - 1 rows
// at most), so that a stage holds them too and a save reads nothing at once
size_t tail_room(const llama_model & model, const llama_memory_hybrid_idx & mem) {
    size_t room = 0;
    if (const llama_kv_cache * idx = mem.get_mem_idx()) {
        for (uint32_t il : idx->get_layer_ids()) {
            room += (model.hparams.dsv4_compress_ratios[il] - 1) * idx->get_k_storage((int32_t) il)->nb[1];
        }
    }
    if (const pyqsa_kv_pager * pager = mem.get_mem_attn()->get_pyqsa_pager()) {
        for (int32_t il = 0; il < (int32_t) model.hparams.n_layer(); ++il) {
            if (const pyqsa_kv_pager_layer * l = pager->layer(il)) {
                room += (l->r - 1) * (l->keys->nb[1] + l->dev_k->nb[1] + l->dev_v->nb[1]);
            }
        }
    }
    return room;
}

// the recurrent section's own bytes (its cell, each layer's type and row sizes: a few dozen a
// layer), which a save writes through the stage with its reads (writer::stage_writes)
constexpr size_t section_room = 64u << 10;

// the device of the recurrent tensors that has pinned host memory, or none (a CPU device)
ggml_backend_dev_t stage_device(const std::set<const ggml_tensor *> & recurrent) {
    for (const ggml_tensor * t : recurrent) {
        if (t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer)) {
            continue;
        }
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
        if (dev != nullptr && ggml_backend_dev_host_buffer_type(dev) != nullptr) {
            return dev;
        }
    }
    return nullptr;
}

// whether dev (may be none) queues reads and records events
bool queues_reads(ggml_backend_dev_t dev) {
    ggml_backend_dev_props props = {};
    if (dev != nullptr) {
        ggml_backend_dev_get_props(dev, &props);
    }
    return props.caps.async && props.caps.events;
}

// ctx's backend of device dev (the stream its passes run on) where dev queues reads and records
// events, or none
ggml_backend_t stage_queue(llama_context & ctx, ggml_backend_dev_t dev) {
    if (!queues_reads(dev)) {
        return nullptr;
    }
    ggml_backend_sched_t sched = ctx.get_sched();
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        if (ggml_backend_t be = ggml_backend_sched_get_backend(sched, i); ggml_backend_get_device(be) == dev) {
            return be;
        }
    }
    return nullptr;
}

// The sequence's n_tokens positions into w in llama_memory_hybrid_idx::state_write's order (which
// its state_read reads), then with paging the tail block's rows and the block keys' series; with
// h, the recurrent section too and the sections' offsets in h. Returns the number of llama.cpp's
// series (the first of w.rows).
uint32_t walk(llama_context * ctx, llama_memory_hybrid_idx & mem, int32_t seq_id, uint32_t n_tokens, writer & w,
              header * h) {
    mem.get_mem_attn()->state_write(w, seq_id, 0);
    if (h != nullptr) {
        h->recr_begin = w.n_bytes();
        w.stage_writes(true);
        mem.get_mem_recr()->state_write(w, seq_id, 0);
        w.stage_writes(false);
        h->recr_end = w.n_bytes();
    }
    if (llama_kv_cache * idx = mem.get_mem_idx()) {
        w.indexer_section(indexer_ratios(*llama_get_model(ctx), *idx));
        idx->state_write(w, seq_id, 0);
    }
    if (h != nullptr) {
        h->llama_end = w.n_bytes();
    }
    const auto n_llama = (uint32_t) w.rows.size();
    if (const pyqsa_kv_pager * pager = mem.get_mem_attn()->get_pyqsa_pager()) {
        const llama_model & model = *llama_get_model(ctx);
        for (const rows_run & run : tail_rows(model, *pager, (uint32_t) seq_id, n_tokens)) {
            w.copy(run.t, run.offset, run.size);
        }
        for (const series & s : block_keys(model, *pager, (uint32_t) seq_id)) {
            w.rows.push_back(s);
        }
    }
    return n_llama;
}

// (no wait for the device first: the writer waits before its first read made at once, and the
// caller unless the stage queued reads)
void save(llama_context * ctx, int32_t seq_id, stage * staged, uint8_t ** out, size_t * out_size,
          pyqsa_seq_rows ** rows_out) {
    llama_memory_hybrid_idx * mem = hybrid_of(ctx);
    if (mem == nullptr) {
        throw unsupported("no hybrid memory");
    }
    header h = {};
    h.magic    = magic;
    h.version  = version;
    h.n_tokens = (uint32_t) (llama_memory_seq_pos_max(mem, seq_id) + 1);
    std::set<const ggml_tensor *> recurrent = recurrent_tensors(*mem);
    const size_t                  reserve   = head_estimate(*mem, recurrent, h.n_tokens);
    writer w(false, reserve, h.n_tokens, std::move(recurrent), staged, [ctx] { llama_synchronize(ctx); });
    w.take(sizeof(h));  // written last, once its offsets are known
    h.n_llama = walk(ctx, *mem, seq_id, h.n_tokens, w, &h);
    h.table_offset = w.n_bytes();
    h.n_series     = (uint32_t) w.rows.size();
    for (const series & s : w.rows) {
        w.write(&s.d, sizeof(s.d));
    }
    auto * rows = rows_out != nullptr ? new pyqsa_seq_rows{ h.n_tokens, w.rows } : nullptr;
    *out_size   = w.n_bytes();
    *out        = w.release();
    std::memcpy(*out, &h, sizeof(h));
    if (rows_out != nullptr) {
        *rows_out = rows;
    }
}

void check_segments(const parsed & p, const pyqsa_rows_segment * segs, size_t n_segs) {
    uint32_t at = 0;
    for (size_t i = 0; i < n_segs; ++i) {
        const pyqsa_rows_segment & s = segs[i];
        if (s.data == nullptr || s.start != at || s.end < s.start ||
            s.size != segment_offset(p.table, p.table.size(), s.start, s.end)) {
            throw std::runtime_error("sequence state: segments that do not cover it");
        }
        at = s.end;
    }
    if (at != p.h.n_tokens) {
        throw std::runtime_error("sequence state: segments that do not cover it");
    }
}

void load(llama_context * ctx, int32_t seq_id, const uint8_t * head, size_t size, const pyqsa_rows_segment * segs,
          size_t n_segs) {
    llama_memory_hybrid_idx * mem = hybrid_of(ctx);
    if (mem == nullptr) {
        throw unsupported("no hybrid memory");
    }
    const parsed p = parse(head, size);
    check_segments(p, segs, n_segs);
    reader r(head, p.h.llama_end, sizeof(header), p, segs, n_segs, recurrent_tensors(*mem));
    mem->state_read(r, seq_id, 0);  // throws, and leaves the sequence empty, when it fails
    if (r.next != p.h.n_llama || r.n_bytes() != p.h.llama_end ||
        llama_memory_seq_pos_max(mem, seq_id) + 1 != (llama_pos) p.h.n_tokens) {
        throw std::runtime_error("sequence state: not the sequence saved");
    }
    pyqsa_kv_pager * pager = mem->get_mem_attn()->get_pyqsa_pager();
    if (pager == nullptr) {
        if (p.h.n_series != p.h.n_llama || p.h.llama_end != p.h.table_offset) {
            throw std::runtime_error("sequence state: saved with paging");
        }
        return;
    }
    const llama_model & model = *llama_get_model(ctx);
    const auto          keys  = block_keys(model, *pager, (uint32_t) seq_id);
    if (keys.size() != p.h.n_series - p.h.n_llama) {
        throw std::runtime_error("sequence state: saved with other paging");
    }
    for (size_t i = 0; i < keys.size(); ++i) {
        const size_t k = p.h.n_llama + i;
        if (p.table[k].ratio != keys[i].d.ratio || p.table[k].row_bytes != keys[i].d.row_bytes) {
            throw std::runtime_error("sequence state: saved with other paging");
        }
        r.set_rows(k, keys[i].t, keys[i].base);
    }
    reader tail(head, p.h.table_offset, p.h.llama_end, p, nullptr, 0, {});
    for (const rows_run & run : tail_rows(model, *pager, (uint32_t) seq_id, p.h.n_tokens)) {
        ggml_backend_tensor_set(run.t, tail.take(run.size), run.offset, run.size);
    }
    if (tail.n_bytes() != p.h.table_offset) {
        throw std::runtime_error("sequence state: saved with other paging");
    }
    next_generation(model, *pager, seq_id);
}

void resume(llama_context * ctx, int32_t seq_id, const uint8_t * head, size_t size) {
    llama_memory_hybrid_idx * mem = hybrid_of(ctx);
    if (mem == nullptr) {
        throw unsupported("no hybrid memory");
    }
    const parsed      p = parse(head, size);
    const llama_pos   n = (llama_pos) p.h.n_tokens;
    if (n == 0 || llama_memory_seq_pos_max(mem, seq_id) + 1 < n) {
        throw std::runtime_error("sequence state: the sequence does not hold it");
    }
    // the recurrent state cannot be shortened: emptied first, so the caches' rows can be
    llama_memory_recurrent * recr = mem->get_mem_recr();
    recr->seq_rm(seq_id, -1, -1);
    if (!mem->seq_rm(seq_id, n, -1)) {
        throw std::runtime_error("sequence state: cannot drop the later positions");
    }
    reader r(head, p.h.recr_end, p.h.recr_begin, p, nullptr, 0, recurrent_tensors(*mem));
    recr->state_read(r, seq_id, 0);
    if (r.n_bytes() != p.h.recr_end || llama_memory_seq_pos_max(mem, seq_id) + 1 != n) {
        throw std::runtime_error("sequence state: not the sequence saved");
    }
    if (llama_kv_cache * idx = mem->get_mem_idx()) {
        // the raw keys of the tail block, in the cells later positions' block keys may have taken
        writer cells(true, 0, (uint32_t) n, {});
        cells.indexer_section(indexer_ratios(*llama_get_model(ctx), *idx));
        idx->state_write(cells, seq_id, 0);
        size_t k = 0;
        for (const series & s : cells.rows) {
            while (k < p.h.n_llama && p.table[k].ratio == 1) {
                ++k;
            }
            if (k == p.h.n_llama || p.table[k].row_bytes != s.d.row_bytes || p.table[k].ratio != s.d.ratio) {
                throw std::runtime_error("sequence state: saved with another indexer");
            }
            const series_desc & d    = p.table[k++];
            const size_t        tail = (size_t) (n / d.ratio) * d.ratio;
            const size_t        len  = (n - tail) * d.row_bytes;
            if (d.tail_offset + len > p.h.llama_end) {
                throw std::runtime_error("sequence state: not a head");
            }
            ggml_backend_tensor_set(s.t, head + d.tail_offset, tail * d.row_bytes, len);
        }
    }
    if (pyqsa_kv_pager * pager = mem->get_mem_attn()->get_pyqsa_pager()) {
        const llama_model & model = *llama_get_model(ctx);
        reader              tail(head, p.h.table_offset, p.h.llama_end, p, nullptr, 0, {});
        for (const rows_run & run : tail_rows(model, *pager, (uint32_t) seq_id, p.h.n_tokens)) {
            ggml_backend_tensor_set(run.t, tail.take(run.size), run.offset, run.size);
        }
        next_generation(model, *pager, seq_id);
    }
}

// the bytes of the segment [start, end) of rows (start <= end <= their length)
size_t segment_bytes(const pyqsa_seq_rows & rows, uint32_t start, uint32_t end) {
    std::vector<series_desc> table;
    for (const series & s : rows.s) {
        table.push_back(s.d);
    }
    return segment_offset(table, table.size(), start, end);
}

bool valid(const void * ctx_v, int32_t seq_id) {
    if (ctx_v == nullptr || seq_id < 0) {
        return false;
    }
    auto * ctx = static_cast<llama_context *>(const_cast<void *>(ctx_v));
    return (uint32_t) seq_id < llama_n_seq_max(ctx);
}

// runs a load or resume; on an error the sequence is left empty
template <typename F> int32_t replace(void * ctx_v, int32_t seq_id, F && f) {
    auto * ctx = static_cast<llama_context *>(ctx_v);
    llama_synchronize(ctx);
    try {
        f(ctx);
        return PYQSA_OK;
    } catch (const unsupported &) {
        return PYQSA_ERR_UNSUPPORTED;
    } catch (const std::exception &) {
        llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
        return PYQSA_ERR_INVALID_ARG;
    }
}

}  // namespace

int32_t pyqsa_seq_state_save(void * ctx_v, int32_t seq_id, pyqsa_seq_stage * staged, void ** head, size_t * size,
                             pyqsa_seq_rows ** rows) {
    if (!valid(ctx_v, seq_id) || head == nullptr || size == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    if (staged != nullptr && staged->busy.exchange(true)) {
        return PYQSA_ERR_INVALID_ARG;  // its last head not filled yet
    }
    auto * ctx = static_cast<llama_context *>(ctx_v);
    int32_t rc = PYQSA_OK;
    try {
        save(ctx, seq_id, staged ? &staged->s : nullptr, reinterpret_cast<uint8_t **>(head), size, rows);
        // NOTE: the rows are read later, on another thread: after the event of the stage's queued
        // reads (fill comes first), else after this wait. Without the wait a save queued behind
        // the last save's reads, ~80 MB each at the full shape, before writing a byte.
        if (staged == nullptr || !staged->s.has_queued()) {
            llama_synchronize(ctx);
        }
    } catch (const unsupported &) {
        rc = PYQSA_ERR_UNSUPPORTED;
    } catch (const std::bad_alloc &) {
        rc = PYQSA_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &) {
        rc = PYQSA_ERR_INVALID_ARG;
    }
    if (staged != nullptr && (rc != PYQSA_OK || staged->s.empty())) {  // nothing to fill
        staged->s.clear();
        staged->busy = false;
    } else if (staged != nullptr) {
        staged->s.close();  // its reads queued ahead of the next pass; fill waits for them
    }
    return rc;
}

int32_t pyqsa_seq_stage_new(void * ctx_v, pyqsa_seq_stage ** out) {
    if (ctx_v == nullptr || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    llama_memory_hybrid_idx * mem = hybrid_of(static_cast<llama_context *>(ctx_v));
    if (mem == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    // the states' device's pinned host memory, else (a CPU device, a device without it) host memory
    const llama_model &                 model     = *llama_get_model(static_cast<llama_context *>(ctx_v));
    const std::set<const ggml_tensor *> recurrent = recurrent_tensors(*mem);
    const size_t                        bytes     = recurrent_bytes(*mem, recurrent) + tail_room(model, *mem) + section_room;
    ggml_backend_dev_t                  dev       = stage_device(recurrent);
    ggml_backend_buffer_type_t buft = dev ? ggml_backend_dev_host_buffer_type(dev) : ggml_backend_cpu_buffer_type();
    ggml_backend_buffer_t      buf  = ggml_backend_buft_alloc_buffer(buft, std::max<size_t>(bytes, 1));
    if (buf == nullptr) {
        return PYQSA_ERR_OUT_OF_MEMORY;
    }
    ggml_backend_t       queue = stage_queue(*static_cast<llama_context *>(ctx_v), dev);
    ggml_backend_event_t done  = queue != nullptr ? ggml_backend_event_new(dev) : nullptr;
    *out                       = new pyqsa_seq_stage{ stage(buf, queue, done) };
    return PYQSA_OK;
}

int32_t pyqsa_seq_stage_fill(pyqsa_seq_stage * staged, void * head, size_t size) {
    if (staged == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    if (!staged->busy) {
        return PYQSA_OK;  // the save staged nothing (or failed)
    }
    int32_t rc = PYQSA_OK;
    try {
        if (head != nullptr) {
            staged->s.fill(static_cast<uint8_t *>(head), size);
        }
        staged->s.clear();
    } catch (const std::exception &) {
        staged->s.clear();
        rc = PYQSA_ERR_INVALID_ARG;
    }
    staged->busy = false;
    return rc;
}

void pyqsa_seq_stage_free(pyqsa_seq_stage * staged) {
    delete staged;
}

void pyqsa_seq_head_free(void * head) {
    std::free(head);
}

int32_t pyqsa_seq_rows_get(const pyqsa_seq_rows * rows, uint32_t start, uint32_t end, void * dst, size_t cap,
                           pyqsa_rows_reader * reader) {
    if (rows == nullptr || dst == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    if (start > end || end > rows->n_tokens || cap < segment_bytes(*rows, start, end)) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    auto * out = static_cast<uint8_t *>(dst);
    for (const series & s : rows->s) {
        const size_t row = start / s.d.ratio;
        const size_t cnt = end / s.d.ratio - row;
        if (cnt > 0 && reader != nullptr) {
            reader->r.read(s.t, s.base + row * s.d.row_bytes, cnt * s.d.row_bytes, out);
        } else if (cnt > 0) {
            ggml_backend_tensor_get(s.t, out, s.base + row * s.d.row_bytes, cnt * s.d.row_bytes);
        }
        out += cnt * s.d.row_bytes;
    }
    if (reader != nullptr) {
        reader->r.finish();
    }
    return PYQSA_OK;
}

int32_t pyqsa_rows_reader_new(void * ctx_v, pyqsa_rows_reader ** out) {
    if (ctx_v == nullptr || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    // the one device of the context's backends that is not the CPU
    ggml_backend_sched_t sched = static_cast<llama_context *>(ctx_v)->get_sched();
    ggml_backend_dev_t   dev   = nullptr;
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        ggml_backend_dev_t d = ggml_backend_get_device(ggml_backend_sched_get_backend(sched, i));
        if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            continue;
        }
        if (dev != nullptr && d != dev) {
            return PYQSA_ERR_UNSUPPORTED;
        }
        dev = d;
    }
    if (!queues_reads(dev) || ggml_backend_dev_host_buffer_type(dev) == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    ggml_backend_t queue = ggml_backend_dev_init(dev, nullptr);
    if (queue == nullptr) {
        return PYQSA_ERR_OUT_OF_MEMORY;
    }
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(ggml_backend_dev_host_buffer_type(dev), 16u << 20);
    ggml_backend_event_t  ev0 = ggml_backend_event_new(dev), ev1 = ggml_backend_event_new(dev);
    if (buf == nullptr || ev0 == nullptr || ev1 == nullptr) {
        ggml_backend_event_free(ev0);
        ggml_backend_event_free(ev1);
        ggml_backend_buffer_free(buf);
        ggml_backend_free(queue);
        return PYQSA_ERR_OUT_OF_MEMORY;
    }
    *out = new pyqsa_rows_reader{ { queue, ggml_backend_free }, rows_reader(queue, buf, ev0, ev1) };
    return PYQSA_OK;
}

void pyqsa_rows_reader_free(pyqsa_rows_reader * reader) {
    delete reader;
}

int32_t pyqsa_seq_rows_open(void * ctx_v, int32_t seq_id, pyqsa_seq_rows ** out) {
    if (!valid(ctx_v, seq_id) || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    auto *                    ctx = static_cast<llama_context *>(ctx_v);
    llama_memory_hybrid_idx * mem = hybrid_of(ctx);
    if (mem == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    try {
        const auto n = (uint32_t) (llama_memory_seq_pos_max(mem, seq_id) + 1);
        writer     w(true, 0, n, {});  // counting: the series, no head
        walk(ctx, *mem, seq_id, n, w, nullptr);
        llama_synchronize(ctx);  // the rows are read on another thread, after the passes that wrote them
        *out = new pyqsa_seq_rows{ n, std::move(w.rows) };
        return PYQSA_OK;
    } catch (const unsupported &) {
        return PYQSA_ERR_UNSUPPORTED;
    } catch (const std::bad_alloc &) {
        return PYQSA_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &) {
        return PYQSA_ERR_INVALID_ARG;
    }
}

int32_t pyqsa_seq_rows_bytes(const pyqsa_seq_rows * rows, uint32_t start, uint32_t end, size_t * size) {
    if (rows == nullptr || size == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    if (start > end || end > rows->n_tokens) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    *size = segment_bytes(*rows, start, end);
    return PYQSA_OK;
}

void pyqsa_seq_rows_free(pyqsa_seq_rows * rows) {
    delete rows;
}

int32_t pyqsa_seq_state_load(void * ctx_v, int32_t seq_id, const void * head, size_t head_size,
                             const pyqsa_rows_segment * segments, size_t n_segments) {
    if (!valid(ctx_v, seq_id) || head == nullptr || (segments == nullptr && n_segments > 0)) {
        return PYQSA_ERR_INVALID_ARG;
    }
    return replace(ctx_v, seq_id, [&](llama_context * ctx) {
        load(ctx, seq_id, static_cast<const uint8_t *>(head), head_size, segments, n_segments);
    });
}

int32_t pyqsa_seq_state_resume(void * ctx_v, int32_t seq_id, const void * head, size_t head_size) {
    if (!valid(ctx_v, seq_id) || head == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    return replace(ctx_v, seq_id,
                   [&](llama_context * ctx) { resume(ctx, seq_id, static_cast<const uint8_t *>(head), head_size); });
}
