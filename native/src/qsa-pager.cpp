// Host-backed KV paging of the indexed layers (see qsa-pager.h).
#include "qsa-pager.h"

#include "pyqsa-lazy-host.h"
#include "pyqsa-context.h"

#include "llama-impl.h"
#include "llama-model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace {

// whether the context being built pages a model with QSA layers
bool pages(const llama_model & model) {
    const auto & hp = model.hparams;
    const bool   qsa = std::any_of(hp.dsv4_compress_ratios.begin(), hp.dsv4_compress_ratios.begin() + hp.n_layer(),
                                   [](uint32_t r) { return r > 0; });
    return pyqsa_context_config_take().hot_blocks > 0 && qsa;
}

// PYQSA_PAGING_PREFETCH=0 keeps prefill chunks on the windowed staging path (for comparison)
bool prefetch_on() {
    const char * v = std::getenv("PYQSA_PAGING_PREFETCH");
    return v == nullptr || std::strcmp(v, "0") != 0;
}

// PYQSA_PAGING_PREFETCH_MIN_TOKENS=N: chunks of fewer than N tokens a stream take the staged
// windows, which bring only the blocks their queries select, where a prefetch brings the whole
// history (a study knob: which is cheaper for a short chunk at long context depends on how
// many distinct blocks its queries select); a value that is no count of tokens is ignored, said
int64_t prefetch_min_tokens_from_env() {
    const char * v = std::getenv("PYQSA_PAGING_PREFETCH_MIN_TOKENS");
    if (v == nullptr) {
        return 0;
    }
    char *          end = nullptr;
    const long long n   = std::strtoll(v, &end, 10);
    if (end == v || *end != '\0' || n < 0) {
        // NOTE: stderr, not llama.cpp's log, which pyqsa keeps quiet unless PYQSA_LLAMA_LOG is set
        std::fprintf(stderr, "pyqsa: PYQSA_PAGING_PREFETCH_MIN_TOKENS=%s is not a count of tokens: ignored\n", v);
        return 0;
    }
    return n;
}

bool is_tag(const char * name_tag, const char * tag) {
    return name_tag != nullptr && std::strcmp(name_tag, tag) == 0;
}

}  // namespace

ggml_backend_buffer_type_t pyqsa_kv_cache_buft(const llama_model & model, int32_t il, ggml_backend_buffer_type_t buft,
                                               const char * name_tag) {
    if (!pages(model) || model.hparams.dsv4_compress_ratios[il] == 0) {
        return buft;
    }
    if (is_tag(name_tag, "idx_")) {  // unread: the pager keeps the block keys
        return pyqsa_lazy_host_buffer_type();
    }
    if (!is_tag(name_tag, "")) {
        return buft;
    }
    // the device's pinned host memory; a CPU device has none, and its memory is host memory
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    ggml_backend_buffer_type_t host = dev ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    return host ? host : buft;
}

std::shared_ptr<pyqsa_kv_pager> pyqsa_kv_pager_create(const llama_model & model, const char * name_tag,
                                                      uint32_t n_stream, uint32_t kv_size,
                                                      const std::vector<pyqsa_kv_layer_tensors> & layers) {
    if (!pages(model) || !is_tag(name_tag, "")) {
        return nullptr;
    }
    const auto & hp     = model.hparams;
    uint32_t     r_max  = 1;
    for (const auto & l : layers) {
        r_max = std::max(r_max, hp.dsv4_compress_ratios[l.il]);
    }
    const int64_t              n_ubatch = std::max<uint32_t>(1, pyqsa_context_building_n_ubatch());
    const pyqsa_context_config cfg      = pyqsa_context_config_take();
    return std::make_shared<pyqsa_kv_pager>(model, layers, n_stream, kv_size, cfg.hot_blocks, n_ubatch + r_max - 1,
                                            cfg.hot_type);
}

pyqsa_kv_pager::pyqsa_kv_pager(const llama_model & model, const std::vector<pyqsa_kv_layer_tensors> & kv_layers,
                               uint32_t n_stream, uint32_t kv_size, int64_t hot_blocks, int64_t ring,
                               int32_t hot_type) :
    H(hot_blocks), W(ring), n_cells(kv_size), area_rows(prefetch_on() ? kv_size : 0),
    area_min_tokens(prefetch_min_tokens_from_env()), n_stream(n_stream) {
    const auto & hp = model.hparams;
    // one context per device buffer type, as llama_kv_cache groups its tensors
    std::map<ggml_backend_buffer_type_t, ggml_context *> ctx_of;
    // per device buffer type, its two prefetch areas (K, V each) and the paged layers it has
    std::map<ggml_backend_buffer_type_t, std::array<ggml_tensor *, 4>> areas_of;
    std::map<ggml_backend_buffer_type_t, int> n_layers_of;
    // a graph's fetches live in the input set of one ratio, so layers of several ratios do not prefetch
    uint32_t r_first = 0;
    for (const auto & l : kv_layers) {
        const uint32_t r = hp.dsv4_compress_ratios[l.il];
        r_first = r_first != 0 ? r_first : r;
        area_rows = r != 0 && r != r_first ? 0 : area_rows;
    }
    for (const auto & l : kv_layers) {
        const uint32_t r = hp.dsv4_compress_ratios[l.il];
        if (r == 0) {
            continue;
        }
        const int64_t kb = std::max<int64_t>(1, (int64_t) hp.indexer_top_k / r);  // blocks one query selects
        if (H < kb) {
            throw std::runtime_error("pyqsa: hot_blocks = " + std::to_string(H) + " cannot hold the " +
                                     std::to_string(kb) + " blocks one query selects in layer " + std::to_string(l.il));
        }
        if (kv_size % r != 0) {
            throw std::runtime_error("pyqsa: paging needs the context size (" + std::to_string(kv_size) +
                                     ") to be a multiple of the compress ratio " + std::to_string(r));
        }
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(model.dev_layer(l.il));
        ggml_context *&            ctx  = ctx_of[buft];
        if (ctx == nullptr) {
            const ggml_init_params params = { (13 * kv_layers.size() + 4) * ggml_tensor_overhead(), nullptr, true };
            ctx = ggml_init(params);
            ctxs.push_back(ctx);
        }
        pyqsa_kv_pager_layer p;
        p.r      = r;
        p.kb     = kb;
        p.host_k = l.k;
        p.host_v = l.v;
        // f16 rows over a q8_0 store: blocks dequantized as they are fetched (pyqsa.h)
        const ggml_type rows_type = hot_type < 0 ? l.k->type : (ggml_type) hot_type;
        if (rows_type != l.k->type && !(rows_type == GGML_TYPE_F16 && l.k->type == GGML_TYPE_Q8_0)) {
            throw std::runtime_error(std::string("pyqsa: a ") + ggml_type_name(rows_type) +
                                     " hot cache needs a q8_0 host store, not " + ggml_type_name(l.k->type));
        }
        p.dev_k  = ggml_new_tensor_3d(ctx, rows_type, l.k->ne[0], slots(r) * r + W, n_stream);
        p.dev_v  = ggml_new_tensor_3d(ctx, rows_type, l.v->ne[0], slots(r) * r + W, n_stream);
        p.table  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, kv_size / r, n_stream);
        p.owner  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, H, n_stream);
        p.stamp  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, H, n_stream);
        p.stats  = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 2, n_stream);
        p.staged = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_stream);
        p.seen   = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_stream);
        p.keys   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hp.indexer_head_size, kv_size / r + W, n_stream);
        // K and V rows of every stream: slots past the hot ones, the ring
        const size_t rows_bytes = 2 * n_stream * p.dev_k->nb[1];
        std::array<size_t, 4> & bytes = part_bytes[buft];
        bytes[(size_t) part::staging] += (slots(r) - H) * r * rows_bytes;
        bytes[(size_t) part::tail] += W * rows_bytes;
        bytes[(size_t) part::keys] += ggml_nbytes_pad(p.keys);
        ggml_format_name(p.dev_k, "pyqsa_hot_k_l%d", l.il);
        ggml_format_name(p.dev_v, "pyqsa_hot_v_l%d", l.il);
        p.area_k = p.area_v = nullptr;
        if (area_rows > 0) {
            std::array<ggml_tensor *, 4> & areas = areas_of[buft];
            const int                      pair  = n_layers_of[buft]++ % 2;
            if (areas[2 * pair] == nullptr) {
                for (int j = 0; j < 2; ++j) {
                    areas[2 * pair + j] = ggml_new_tensor_2d(ctx, l.k->type, l.k->ne[0], area_rows);
                    ggml_format_name(areas[2 * pair + j], "pyqsa_prefetch_%c%d", "kv"[j], pair);
                    bytes[(size_t) part::staging] += ggml_nbytes_pad(areas[2 * pair + j]);
                }
            }
            // every paged layer of a device shares one K/V geometry, so the areas fit them all
            GGML_ASSERT(areas[2 * pair]->type == l.k->type && areas[2 * pair]->ne[0] == l.k->ne[0]);
            p.area_k = areas[2 * pair];
            p.area_v = areas[2 * pair + 1];
        }
        layers[l.il] = p;
    }
    for (auto & [buft, ctx] : ctx_of) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (buf == nullptr) {
            throw std::runtime_error("pyqsa: failed to allocate the hot KV caches");
        }
        ggml_backend_buffer_clear(buf, 0);
        buffers.push_back(buf);
        LLAMA_LOG_INFO("%s: %10s hot KV cache: %lld blocks + %lld ring cells per stream, %8.2f MiB\n", __func__,
                       ggml_backend_buffer_name(buf), (long long) H, (long long) W,
                       ggml_backend_buffer_get_size(buf) / 1024.0 / 1024.0);
    }
    for (auto & [il, p] : layers) {
        for (ggml_tensor * t : { p.table, p.owner, p.stamp }) {
            ggml_backend_tensor_memset(t, 0xff, 0, ggml_nbytes(t));  // -1: nothing resident, never used
        }
    }
}

pyqsa_kv_pager::~pyqsa_kv_pager() {
    for (ggml_backend_buffer_t buf : buffers) {
        ggml_backend_buffer_free(buf);
    }
    for (ggml_context * ctx : ctxs) {
        ggml_free(ctx);
    }
}

const pyqsa_kv_pager_layer * pyqsa_kv_pager::layer(int32_t il) const {
    const auto it = layers.find(il);
    return it == layers.end() ? nullptr : &it->second;
}

int32_t pyqsa_kv_pager::layer_after(int32_t il, int k) const {
    const pyqsa_kv_pager_layer & l = layers.at(il);
    for (auto it = layers.upper_bound(il); it != layers.end(); ++it) {
        // the same pair of areas: the same device (buffer)
        if (it->second.dev_k->buffer == l.dev_k->buffer && --k == 0) {
            return it->first;
        }
    }
    return -1;
}

int32_t pyqsa_kv_pager::next_step() {
    return step++;
}

int64_t pyqsa_kv_pager::blocks_selected(uint32_t r) const {
    for (const auto & [il, p] : layers) {
        if (p.r == r) {
            return p.kb;
        }
    }
    return 0;
}

int64_t pyqsa_kv_pager::n_layers(uint32_t r) const {
    return std::count_if(layers.begin(), layers.end(), [r](const auto & l) { return l.second.r == r; });
}

uint64_t pyqsa_kv_pager::bytes_per_token(uint32_t r) const {
    uint64_t n = 0;
    for (const auto & [il, p] : layers) {
        n += p.r == r ? p.host_k->nb[1] + p.host_v->nb[1] : 0;  // what crosses the host link
    }
    return n;
}

std::vector<int32_t> & pyqsa_kv_pager::generation(uint32_t r) {
    auto & g = generations[r];
    g.resize(n_stream, 0);  // seen starts at 0 too: a fresh stream's empty state is valid
    return g;
}

void pyqsa_kv_pager::copy_stream(uint32_t src, uint32_t dst) {
    std::vector<uint8_t> tmp;
    for (auto & [il, p] : layers) {
        const std::pair<ggml_tensor *, size_t> per_stream[] = {  // each tensor's stream stride
            { p.dev_k, p.dev_k->nb[2] }, { p.dev_v, p.dev_v->nb[2] }, { p.table, p.table->nb[1] },
            { p.owner, p.owner->nb[1] }, { p.stamp, p.stamp->nb[1] }, { p.keys, p.keys->nb[2] },
            { p.seen, p.seen->nb[0] },
        };
        for (const auto & [t, stride] : per_stream) {
            tmp.resize(stride);
            ggml_backend_tensor_get(t, tmp.data(), src * stride, stride);
            ggml_backend_tensor_set(t, tmp.data(), dst * stride, stride);
        }
    }
    for (auto & [r, gen] : generations) {
        gen[dst] = gen[src];
    }
}

std::map<ggml_backend_buffer_type_t, size_t> pyqsa_kv_pager::memory_breakdown(part what) const {
    std::map<ggml_backend_buffer_type_t, size_t> b;
    for (ggml_backend_buffer_t buf : buffers) {
        const ggml_backend_buffer_type_t buft  = ggml_backend_buffer_get_type(buf);
        const std::array<size_t, 4> &    bytes = part_bytes.at(buft);  // every buffer's type has its entry
        b[buft] += what != part::hot ? bytes[(size_t) what]
                                     : ggml_backend_buffer_get_size(buf) - bytes[(size_t) part::staging] -
                                           bytes[(size_t) part::tail] - bytes[(size_t) part::keys];
    }
    return b;
}

pyqsa_kv_pager_counters pyqsa_kv_pager::counters() const {
    pyqsa_kv_pager_counters c = { 0, 0, prefetched_blocks, prefetched_bytes, written, {} };
    std::vector<int64_t>    stats(2 * n_stream), staged(n_stream);
    for (const auto & [il, p] : layers) {
        ggml_backend_tensor_get(p.stats, stats.data(), 0, ggml_nbytes(p.stats));
        ggml_backend_tensor_get(p.staged, staged.data(), 0, ggml_nbytes(p.staged));
        const uint64_t block_bytes = p.r * (p.host_k->nb[1] + p.host_v->nb[1]);
        std::array<uint64_t, 3> layer = { (uint64_t) il, 0, 0 };
        for (uint32_t s = 0; s < n_stream; ++s) {
            layer[1] += stats[2 * s];
            layer[2] += stats[2 * s + 1];
        }
        uint64_t n_staged = 0;
        for (uint32_t s = 0; s < n_stream; ++s) {
            n_staged += staged[s];
        }
        c.hits += layer[1];
        c.misses += layer[2];
        c.staged += n_staged;
        c.bytes_to_device += (layer[2] + n_staged) * block_bytes;
        c.layers.push_back(layer);
    }
    return c;
}
