// The format of a sequence's state (pyqsa-seq-state.cpp): its header and series table, and the
// io classes that write a head with the rows left out and read one back with the rows gathered
// from segments. Internal to pyqsa-seq-state.cpp.
#pragma once

#include "pyqsa.h"

#include "ggml-backend.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid.h"
#include "llama-model.h"
#include "pyqsa-lazy-host.h"
#include "seq-stage.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__linux__)
#    include <sys/mman.h>
#endif

namespace pyqsa_seq_state {

constexpr uint32_t magic   = 0x51534153;  // "QSAS"
constexpr uint32_t version = 3;  // 3: a head's tail rows in runs per ring tensor

struct header {
    uint32_t magic;
    uint32_t version;
    uint32_t n_tokens;      // the sequence's positions 0..n_tokens-1
    uint32_t n_series;      // in the table
    uint32_t n_llama;       // of them llama.cpp's (the rest: the pager's block keys)
    uint32_t pad;
    uint64_t recr_begin;    // llama.cpp's recurrent section: [recr_begin, recr_end) of the head
    uint64_t recr_end;
    uint64_t llama_end;     // where llama.cpp's part ends and the pager's tail rows start
    uint64_t table_offset;  // the series table, to the end of the head
};

struct series_desc {
    uint64_t row_bytes;
    uint64_t tail_offset;  // an indexer cache's: where in the head its tail block's raw keys are
    uint32_t ratio;        // positions per row
    uint32_t pad;
};

struct series {
    ggml_tensor * t;
    size_t        base;  // byte offset of row 0 in t
    series_desc   d;
};

// rows [start / r, end / r) of every series, in order: where series k's start in a segment
inline size_t segment_offset(const std::vector<series_desc> & table, size_t k, uint32_t start, uint32_t end) {
    size_t off = 0;
    for (size_t i = 0; i < k; ++i) {
        off += table[i].row_bytes * (end / table[i].ratio - start / table[i].ratio);
    }
    return off;
}

inline bool is_lazy(const ggml_tensor * t) {
    return t->buffer != nullptr && ggml_backend_buffer_get_type(t->buffer) == pyqsa_lazy_host_buffer_type();
}

// size bytes from src into t at byte offset. Into host memory (the paging host store, a CPU
// build's caches) a large copy is split over threads: one thread's memcpy reaches a fraction of
// the host's memory bandwidth, and a restore's rows are most of a follow-up's time to its first
// token when its slot was taken by another request.
inline void set_bytes(ggml_tensor * t, const uint8_t * src, size_t offset, size_t size) {
    constexpr size_t per_thread = 1u << 20;
    const size_t     n          = std::min<size_t>({ std::max(1u, std::thread::hardware_concurrency()), 16,
                                                     size / per_thread + 1 });
    if (n == 1 || !ggml_backend_buffer_is_host(t->buffer)) {
        ggml_backend_tensor_set(t, src, offset, size);
        return;
    }
    GGML_ASSERT(offset + size <= ggml_nbytes(t));
    uint8_t *                dst  = static_cast<uint8_t *>(t->data) + offset;
    const size_t             part = (size + n - 1) / n;
    std::vector<std::thread> threads;
    for (size_t i = 1; i < n; ++i) {
        const size_t a = std::min(size, i * part), b = std::min(size, a + part);
        threads.emplace_back([=] { std::memcpy(dst + a, src + a, b - a); });
    }
    std::memcpy(dst, src, std::min(size, part));
    for (std::thread & th : threads) {
        th.join();
    }
}

struct unsupported : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// the recurrent memory's tensors: the head carries their bytes, every other tensor's are rows
inline std::set<const ggml_tensor *> recurrent_tensors(const llama_memory_hybrid & mem) {
    std::set<const ggml_tensor *> out;
    const llama_memory_recurrent * r = mem.get_mem_recr();
    for (const auto * v : { &r->r_l, &r->s_l, &r->p_l }) {
        for (ggml_tensor * t : *v) {
            if (t != nullptr) {
                out.insert(t);
            }
        }
    }
    return out;
}

// writes the head into a buffer of its own, grown as it goes (take() hands it over), or only
// counts (`count`); collects the series. One pass: a head's cell metadata is most of its CPU
// time (a few bytes per position, 200K positions in each of two caches), so writing it twice,
// once to size a buffer, doubled the cost of a snapshot.
class writer : public llama_io_write_i {
public:
    // with a stage, the bytes the head copies from tensors go there (while it has room), their
    // place in the head left for stage::fill; `settle` waits for the device (see head_reads)
    writer(bool count, size_t reserve, uint32_t n, std::set<const ggml_tensor *> recurrent,
           stage * staged = nullptr, std::function<void()> settle = {}) :
        count(count),
        n_tokens(n),
        recurrent(std::move(recurrent)),
        reads(staged, std::move(settle)) {
        if (!count) {
            grow(reserve);
        }
    }

    ~writer() override { std::free(buf); }

    writer(const writer &)             = delete;
    writer & operator=(const writer &) = delete;

    void write(const void * src, size_t size) override {
        const size_t at = n;
        uint8_t *    p  = take(size);
        if (p == nullptr || (in_stage && reads.note(src, size, at))) {
            return;
        }
        if (size == sizeof(uint32_t)) {  // a cell's position or sequence id: inlined, no call
            std::memcpy(p, src, sizeof(uint32_t));
        } else {
            std::memcpy(p, src, size);
        }
    }

    void write_tensor(ggml_tensor * t, size_t offset, size_t size) override {
        if (is_lazy(t)) {
            return;  // the unread indexer cache of a paging context (see the top of the file)
        }
        if (recurrent.count(t)) {
            copy(t, offset, size);
            return;
        }
        // a cache's rows: one range of cells from 0, a row per position
        if (offset != 0 || n_tokens == 0 || size % n_tokens != 0 || size / n_tokens != t->nb[1]) {
            throw unsupported("sequence state: cells not in position order");
        }
        const size_t row = t->nb[1];
        if (next_ratio == indexer_ratios.size()) {  // K or V
            rows.push_back({ t, 0, { row, 0, 1, 0 } });
            return;
        }
        const uint32_t r    = indexer_ratios[next_ratio++];
        const size_t   tail = (size_t) (n_tokens / r) * r;  // the tail block's first position
        rows.push_back({ t, 0, { row, n, r, 0 } });
        copy(t, tail * row, (n_tokens - tail) * row);
    }

    // whether the small writes to come go through the stage with the reads (while it has room)
    // rather than into the head: inside the recurrent section, whose bytes are nearly all staged,
    // a layer's few bytes of type and row size every ~2 MB would each fault in (and zero) a huge
    // page of the head on this thread, ~72 MB of zeros a head (8 x 32K on an H100: ~9.5 of a 13
    // ms save, with 36 faults); through the stage the section is the fill's to write, whole
    void stage_writes(bool on) { in_stage = on; }

    // the indexer cache's write_tensor calls to come: the compress ratio of each
    void indexer_section(std::vector<uint32_t> ratios) {
        indexer_ratios = std::move(ratios);
        next_ratio     = 0;
    }

    void copy(ggml_tensor * t, size_t offset, size_t size) {
        const size_t at = n;
        if (uint8_t * p = take(size)) {
            reads.read(t, offset, size, p, at);
        }
    }

    size_t n_bytes() override { return n; }

    // `size` bytes to write to (nullptr when counting)
    uint8_t * take(size_t size) {
        if (count) {
            n += size;
            return nullptr;
        }
        if (n + size > cap) {
            grow(std::max(2 * cap, n + size));
        }
        uint8_t * p = buf + n;
        n += size;
        return p;
    }

    // the head written, its buffer the caller's from now on (to std::free), trimmed to its size
    uint8_t * release() {
        uint8_t * out = static_cast<uint8_t *>(std::realloc(buf, std::max<size_t>(n, 1)));
        out           = out != nullptr ? out : buf;
        buf           = nullptr;
        cap           = 0;
        return out;
    }

    std::vector<series> rows;

private:
    // NOTE: realloc, not a std::vector: glibc moves a large block's pages (mremap) instead of
    // copying its bytes, and huge pages fault a fresh head's ~80 MB of recurrent state in a
    // few dozen faults, not 20,000 (on the thread that writes it: with a stage, the fill's;
    // see stage_writes)
    void grow(size_t to) {
        auto * p = static_cast<uint8_t *>(std::realloc(buf, to));
        if (p == nullptr) {
            throw std::bad_alloc();
        }
#ifdef MADV_HUGEPAGE
        constexpr size_t huge = 2u << 20;
        if (to >= 4 * huge) {
            const uintptr_t a = ((uintptr_t) p + huge - 1) & ~(uintptr_t) (huge - 1);
            const uintptr_t b = ((uintptr_t) p + to) & ~(uintptr_t) (huge - 1);
            if (b > a) {
                madvise((void *) a, b - a, MADV_HUGEPAGE);
            }
        }
#endif
        buf = p;
        cap = to;
    }

    bool                          count;
    bool                          in_stage = false;  // stage_writes
    uint8_t *                     buf      = nullptr;
    size_t                        cap = 0;
    size_t                        n   = 0;
    uint32_t                      n_tokens;
    std::set<const ggml_tensor *> recurrent;
    head_reads                    reads;
    std::vector<uint32_t>         indexer_ratios;
    size_t                        next_ratio = 0;
};

// the compress ratio of each layer of an indexer cache, in its layer order
inline std::vector<uint32_t> indexer_ratios(const llama_model & model, const llama_kv_cache & idx) {
    std::vector<uint32_t> out;
    for (uint32_t il : idx.get_layer_ids()) {
        out.push_back(model.hparams.dsv4_compress_ratios[il]);
    }
    return out;
}

// a head's header and series table, checked
struct parsed {
    header                   h;
    std::vector<series_desc> table;
};

inline parsed parse(const uint8_t * head, size_t size) {
    parsed p;
    if (size < sizeof(header)) {
        throw std::runtime_error("sequence state: truncated");
    }
    std::memcpy(&p.h, head, sizeof(header));
    const header & h = p.h;
    if (h.magic != magic || h.version != version || h.n_llama > h.n_series || h.recr_begin < sizeof(header) ||
        h.recr_begin > h.recr_end || h.recr_end > h.llama_end || h.llama_end > h.table_offset ||
        h.table_offset > size || (size - h.table_offset) != (uint64_t) h.n_series * sizeof(series_desc)) {
        throw std::runtime_error("sequence state: not a head");
    }
    p.table.resize(h.n_series);
    std::memcpy(p.table.data(), head + h.table_offset, h.n_series * sizeof(series_desc));
    for (const series_desc & d : p.table) {
        if (d.ratio == 0 || d.row_bytes == 0) {
            throw std::runtime_error("sequence state: not a head");
        }
    }
    return p;
}

// reads a head's bytes from `pos` on; a cache's rows come from the segments, the recurrent
// tensors' from the head
class reader : public llama_io_read_i {
public:
    reader(const uint8_t * src, size_t size, size_t pos, const parsed & p, const pyqsa_rows_segment * segs,
           size_t n_segs, std::set<const ggml_tensor *> recurrent) :
        src(src),
        size(size),
        n(pos),
        p(p),
        segs(segs),
        n_segs(n_segs),
        recurrent(std::move(recurrent)) {}

    void read(void * dst, size_t len) override { std::memcpy(dst, take(len), len); }

    void read_tensor(ggml_tensor * t, size_t offset, size_t len) override {
        if (is_lazy(t)) {
            return;  // saved without its rows
        }
        if (recurrent.count(t)) {
            ggml_backend_tensor_set(t, take(len), offset, len);
            return;
        }
        if (next >= p.h.n_llama) {
            throw std::runtime_error("sequence state: more rows than saved");
        }
        const series_desc & d = p.table[next];
        if (len != (size_t) p.h.n_tokens * d.row_bytes) {
            throw std::runtime_error("sequence state: rows of another size");
        }
        set_rows(next++, t, offset);
        if (d.ratio > 1) {  // an indexer cache: the raw keys of the tail block follow
            const size_t tail = (size_t) (p.h.n_tokens / d.ratio) * d.ratio;
            if (n != d.tail_offset) {
                throw std::runtime_error("sequence state: not a head");
            }
            const size_t tail_len = (p.h.n_tokens - tail) * d.row_bytes;
            ggml_backend_tensor_set(t, take(tail_len), offset + tail * d.row_bytes, tail_len);
        }
    }

    // series k's rows, gathered from the segments, into t from byte `offset`
    void set_rows(size_t k, ggml_tensor * t, size_t offset) {
        const series_desc & d = p.table[k];
        for (size_t i = 0; i < n_segs; ++i) {
            const pyqsa_rows_segment & s   = segs[i];
            const size_t               row = s.start / d.ratio;
            const size_t               cnt = s.end / d.ratio - row;
            if (cnt > 0) {
                const auto * from = static_cast<const uint8_t *>(s.data) + segment_offset(p.table, k, s.start, s.end);
                set_bytes(t, from, offset + row * d.row_bytes, cnt * d.row_bytes);
            }
        }
    }

    size_t n_bytes() override { return n; }

    const uint8_t * take(size_t len) {
        if (n + len > size) {
            throw std::runtime_error("sequence state: truncated");
        }
        const uint8_t * q = src + n;
        n += len;
        return q;
    }

    size_t next = 0;  // the series the next rows are

private:
    const uint8_t *               src;
    size_t                        size;
    size_t                        n;
    const parsed &                p;
    const pyqsa_rows_segment *    segs;
    size_t                        n_segs;
    std::set<const ggml_tensor *> recurrent;
};

}  // namespace pyqsa_seq_state
