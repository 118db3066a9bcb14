// A sequence's state as bytes (see pyqsa_seq_state_save in pyqsa.h): llama.cpp's own per-sequence
// state of the hybrid memory (the QSA layers' K/V cells, the indexer cells, the Gated DeltaNet
// recurrent and conv states), written through pyqsa's io classes, then, with paging, the pager's
// device rows that llama.cpp does not know of.
//
// Layout: header { magic, version, n_tokens, llama bytes } | llama.cpp's state | pager rows.
// With paging the K/V cells llama.cpp saves are the host store (cell == position), and the
// indexer cache is the unread lazily committed buffer: its rows are left out on save and not
// written on load (writing would commit its pages), so the indexer's content comes from the
// pager's rows: per paged layer, the block keys (rows 0..n_tokens/r-1) and, for the incomplete
// tail block, its raw keys and K/V rows of the rings (the next ubatch reads the tail from there).
// A load starts the stream's next page-state generation: the hot cache it held belongs to
// another sequence.
#include "pyqsa.h"

#include "llama-context.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid.h"
#include "llama-model.h"
#include "pyqsa-lazy-host.h"
#include "qsa-pager.h"

#include <cstring>
#include <exception>
#include <set>
#include <stdexcept>
#include <vector>

namespace {

constexpr uint32_t magic   = 0x51534153;  // "QSAS"
constexpr uint32_t version = 1;

struct header {
    uint32_t magic;
    uint32_t version;
    uint32_t n_tokens;     // the sequence's positions 0..n_tokens-1
    uint32_t pad;
    uint64_t llama_bytes;  // llama.cpp's part, right after the header
};

bool is_lazy(const ggml_tensor * t) {
    return t->buffer != nullptr && ggml_backend_buffer_get_type(t->buffer) == pyqsa_lazy_host_buffer_type();
}

// writes into dst (cap bytes), or only counts when dst is null
class writer : public llama_io_write_i {
public:
    writer(uint8_t * dst, size_t cap) : dst(dst), cap(cap) {}

    void write(const void * src, size_t size) override {
        if (uint8_t * p = take(size)) {
            std::memcpy(p, src, size);
        }
    }

    void write_tensor(ggml_tensor * t, size_t offset, size_t size) override {
        if (is_lazy(t)) {
            return;  // the unread indexer cache of a paging context (see the top of the file)
        }
        if (uint8_t * p = take(size)) {
            ggml_backend_tensor_get(t, p, offset, size);
        }
    }

    size_t n_bytes() override { return n; }

    // `size` bytes to write to (nullptr when counting)
    uint8_t * take(size_t size) {
        if (dst != nullptr && n + size > cap) {
            throw std::out_of_range("sequence state: buffer too small");
        }
        uint8_t * p = dst != nullptr ? dst + n : nullptr;
        n += size;
        return p;
    }

private:
    uint8_t * dst;
    size_t    cap;
    size_t    n = 0;
};

class reader : public llama_io_read_i {
public:
    reader(const uint8_t * src, size_t size) : src(src), size(size) {}

    void read(void * dst, size_t len) override { std::memcpy(dst, take(len), len); }

    void read_tensor(ggml_tensor * t, size_t offset, size_t len) override {
        if (is_lazy(t)) {
            return;  // saved without its rows
        }
        ggml_backend_tensor_set(t, take(len), offset, len);
    }

    size_t n_bytes() override { return n; }

    const uint8_t * take(size_t len) {
        if (n + len > size) {
            throw std::runtime_error("sequence state: truncated");
        }
        const uint8_t * p = src + n;
        n += len;
        return p;
    }

private:
    const uint8_t * src;
    size_t          size;
    size_t          n = 0;
};

llama_memory_hybrid * hybrid_of(llama_context * ctx) {
    return dynamic_cast<llama_memory_hybrid *>(llama_get_memory(ctx));
}

// one contiguous run of rows of stream s of a [E, rows, n_stream] tensor
struct rows_run {
    ggml_tensor * t;
    size_t        offset, size;
};

// the pager's rows a sequence of n tokens in stream s needs: per paged layer the block keys, and
// the tail's raw keys and K/V in the rings (a ring row per position, wrapping)
std::vector<rows_run> pager_rows(const llama_model & model, const pyqsa_kv_pager & pager, uint32_t s, uint32_t n) {
    std::vector<rows_run> runs;
    const int64_t         W = pager.ring();
    for (int32_t il = 0; il < (int32_t) model.hparams.n_layer(); ++il) {
        const pyqsa_kv_pager_layer * l = pager.layer(il);
        if (l == nullptr) {
            continue;
        }
        const int64_t nb     = n / l->r;
        const int64_t n_key0 = pager.kv_size() / l->r;  // the key ring's first row
        const int64_t n_ring = pager.slots(l->r) * l->r;  // the K/V ring's first row
        if (nb > 0) {
            runs.push_back({ l->keys, s * l->keys->nb[2], (size_t) nb * l->keys->nb[1] });
        }
        for (int64_t p = nb * l->r; p < n; ++p) {
            runs.push_back({ l->keys, s * l->keys->nb[2] + (n_key0 + p % W) * l->keys->nb[1], l->keys->nb[1] });
            for (ggml_tensor * t : { l->dev_k, l->dev_v }) {
                runs.push_back({ t, s * t->nb[2] + (n_ring + p % W) * t->nb[1], t->nb[1] });
            }
        }
    }
    return runs;
}

int32_t save(llama_context * ctx, int32_t seq_id, uint8_t * dst, size_t cap, size_t * out_size) {
    llama_memory_hybrid * mem = hybrid_of(ctx);
    if (mem == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    const llama_pos last = llama_memory_seq_pos_max(mem, seq_id);
    header          h    = { magic, version, (uint32_t) (last + 1), 0, 0 };
    writer          w(dst, cap);
    w.take(sizeof(h));
    mem->state_write(w, seq_id, 0);
    h.llama_bytes = w.n_bytes() - sizeof(h);
    if (const pyqsa_kv_pager * pager = mem->get_mem_attn()->get_pyqsa_pager()) {
        for (const rows_run & run : pager_rows(*llama_get_model(ctx), *pager, (uint32_t) seq_id, h.n_tokens)) {
            w.write_tensor(run.t, run.offset, run.size);
        }
    }
    if (dst != nullptr) {
        std::memcpy(dst, &h, sizeof(h));
    }
    *out_size = w.n_bytes();
    return PYQSA_OK;
}

int32_t load(llama_context * ctx, int32_t seq_id, const uint8_t * src, size_t size) {
    llama_memory_hybrid * mem = hybrid_of(ctx);
    if (mem == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    reader r(src, size);
    header h;
    r.read(&h, sizeof(h));
    if (h.magic != magic || h.version != version || h.llama_bytes > size - sizeof(h)) {
        return PYQSA_ERR_INVALID_ARG;
    }
    mem->state_read(r, seq_id, 0);  // throws, and leaves the sequence empty, when it fails
    if (llama_memory_seq_pos_max(mem, seq_id) + 1 != (llama_pos) h.n_tokens) {
        throw std::runtime_error("sequence state: wrong length");
    }
    pyqsa_kv_pager * pager = mem->get_mem_attn()->get_pyqsa_pager();
    if (pager == nullptr) {
        return r.n_bytes() == size ? PYQSA_OK : PYQSA_ERR_INVALID_ARG;
    }
    const llama_model & model = *llama_get_model(ctx);
    for (const rows_run & run : pager_rows(model, *pager, (uint32_t) seq_id, h.n_tokens)) {
        r.read_tensor(run.t, run.offset, run.size);
    }
    std::set<uint32_t> ratios;
    for (int32_t il = 0; il < (int32_t) model.hparams.n_layer(); ++il) {
        if (const pyqsa_kv_pager_layer * l = pager->layer(il)) {
            ratios.insert(l->r);
        }
    }
    for (uint32_t ratio : ratios) {
        pager->generation(ratio)[seq_id] += 1;  // its next resolve empties the stream's hot cache
    }
    return r.n_bytes() == size ? PYQSA_OK : PYQSA_ERR_INVALID_ARG;
}

bool valid(const void * ctx_v, int32_t seq_id) {
    if (ctx_v == nullptr || seq_id < 0) {
        return false;
    }
    auto * ctx = static_cast<llama_context *>(const_cast<void *>(ctx_v));
    return (uint32_t) seq_id < llama_n_seq_max(ctx);
}

}  // namespace

int32_t pyqsa_seq_state_save(void * ctx_v, int32_t seq_id, void * dst, size_t cap, size_t * size) {
    if (!valid(ctx_v, seq_id) || size == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    auto * ctx = static_cast<llama_context *>(ctx_v);
    llama_synchronize(ctx);
    try {
        return save(ctx, seq_id, static_cast<uint8_t *>(dst), cap, size);
    } catch (const std::out_of_range &) {
        return PYQSA_ERR_OUT_OF_RANGE;
    } catch (const std::exception &) {
        return PYQSA_ERR_INVALID_ARG;
    }
}

int32_t pyqsa_seq_state_load(void * ctx_v, int32_t seq_id, const void * src, size_t size) {
    if (!valid(ctx_v, seq_id) || src == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    auto * ctx = static_cast<llama_context *>(ctx_v);
    llama_synchronize(ctx);
    try {
        const int32_t rc = load(ctx, seq_id, static_cast<const uint8_t *>(src), size);
        if (rc != PYQSA_OK) {
            llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
        }
        return rc;
    } catch (const std::exception &) {
        llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
        return PYQSA_ERR_INVALID_ARG;
    }
}
