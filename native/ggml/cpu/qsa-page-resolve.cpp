// CPU kernel of PYQSA_GGML_OP_QSA_PAGE_RESOLVE: one stream per work item. The "device" hot
// cache is a separate buffer here too, so CPU runs exercise the same paging as CUDA ones.
#include "qsa-page-resolve.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"
#include "qsa-page-convert.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

struct page_args {
    const int32_t * blocks;  // [kb, n_q] of the stream
    const int32_t * n_vis;   // [n_q]
    int32_t *       table;   // [n_blocks]
    int32_t *       owner;   // [H]
    int32_t *       stamp;   // [H]
    int64_t *       stats;   // [2]
    char *          hot[2];    // [H] rows of B bytes; [1] null without a second pair
    const char *    store[2];  // [n_store] rows of B_store bytes
    int32_t *       out;     // [kb, n_q]
    int64_t kb, n_q, H, n_blocks;
    size_t    B, B_store;
    int64_t   n_elem;                  // elements of a block row
    ggml_type hot_type, store_type;
    int32_t   step;
    bool    reset;  // a new generation of the stream: nothing resident is valid
};

void resolve_stream(const page_args & a) {
    if (a.reset) {
        std::fill(a.table, a.table + a.n_blocks, -1);
        std::fill(a.owner, a.owner + a.H, -1);
        std::fill(a.stamp, a.stamp + a.H, -1);
    }
    // hits pin their slot for this step; misses are the distinct blocks not resident
    int64_t              hits = 0;
    std::vector<int32_t> miss;
    for (int64_t q = 0; q < a.n_q; ++q) {
        for (int64_t j = 0; j < a.kb; ++j) {
            const int32_t b = a.blocks[q * a.kb + j];
            if (b >= a.n_vis[q]) {
                continue;
            }
            GGML_ASSERT(b >= 0 && b < a.n_blocks);
            const int32_t slot = a.table[b];
            if (slot >= 0) {
                a.stamp[slot] = a.step;
                ++hits;
            } else {
                miss.push_back(b);
            }
        }
    }
    std::sort(miss.begin(), miss.end());
    miss.erase(std::unique(miss.begin(), miss.end()), miss.end());

    // victims: unpinned slots, least recently used first (free slots have stamp -1), then slot
    std::vector<int32_t> victims;
    for (int32_t h = 0; h < (int32_t) a.H; ++h) {
        if (a.stamp[h] != a.step) {
            victims.push_back(h);
        }
    }
    GGML_ASSERT(miss.size() <= victims.size());
    // only the first miss.size() in that order are taken: pick them, then sort just those
    const auto lru = [&](int32_t x, int32_t y) { return a.stamp[x] != a.stamp[y] ? a.stamp[x] < a.stamp[y] : x < y; };
    const auto taken = victims.begin() + (std::ptrdiff_t) miss.size();
    std::nth_element(victims.begin(), taken, victims.end(), lru);
    std::sort(victims.begin(), taken, lru);
    for (size_t i = 0; i < miss.size(); ++i) {
        const int32_t slot = victims[i];
        if (a.owner[slot] >= 0) {
            a.table[a.owner[slot]] = -1;
        }
        a.owner[slot]     = miss[i];
        a.stamp[slot]     = a.step;
        a.table[miss[i]]  = slot;
        for (int k = 0; k < 2 && a.hot[k]; ++k) {
            pyqsa_cpu_page_fetch_row(a.hot[k] + slot * a.B, a.hot_type, a.store[k] + miss[i] * a.B_store,
                                     a.store_type, a.n_elem);
        }
    }
    a.stats[0] += hits;
    a.stats[1] += (int64_t) miss.size();

    for (int64_t q = 0; q < a.n_q; ++q) {
        for (int64_t j = 0; j < a.kb; ++j) {
            const int32_t b = a.blocks[q * a.kb + j];
            a.out[q * a.kb + j] = b < a.n_vis[q] ? a.table[b] : -1;
        }
    }
}

}  // namespace

void pyqsa_cpu_qsa_page_resolve(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * blocks = dst->src[0];
    const ggml_tensor * table  = dst->src[2];
    const ggml_tensor * hot    = dst->src[7];
    int64_t             n_store = 0;
    const char *        store[2];
    for (int k = 0; k < 2; ++k) {
        store[k] = (const char *) pyqsa_ggml_qsa_page_store(dst, k, &n_store);
    }

    page_args a;
    a.kb       = blocks->ne[0];
    a.n_q      = blocks->ne[1];
    a.H        = hot->ne[1];
    a.n_blocks = table->ne[0];
    a.B          = hot->nb[1];
    a.B_store    = pyqsa_ggml_qsa_page_store_row(dst);
    a.n_elem     = hot->ne[0];
    a.hot_type   = hot->type;
    a.store_type = pyqsa_ggml_qsa_page_store_type(dst);
    const int32_t * step = (const int32_t *) dst->src[5]->data;
    a.step     = step[0];
    const int64_t ns = blocks->ne[2];
    for (int64_t s = params->ith; s < ns; s += params->nth) {
        a.blocks = (const int32_t *) blocks->data + s * a.kb * a.n_q;
        a.n_vis  = (const int32_t *) dst->src[1]->data + s * a.n_q;
        a.table  = (int32_t *) table->data + s * a.n_blocks;
        a.owner  = (int32_t *) dst->src[3]->data + s * a.H;
        a.stamp  = (int32_t *) dst->src[4]->data + s * a.H;
        a.stats  = (int64_t *) dst->src[6]->data + s * 2;
        for (int k = 0; k < 2; ++k) {
            const ggml_tensor * h = dst->src[7 + k];
            a.hot[k]   = h ? (char *) h->data + s * h->nb[2] : nullptr;
            a.store[k] = h ? store[k] + s * n_store * a.B_store : nullptr;
        }
        a.out    = (int32_t *) dst->data + s * a.kb * a.n_q;
        int32_t * seen = dst->src[9] ? (int32_t *) dst->src[9]->data + s : nullptr;
        a.reset        = seen != nullptr && *seen != step[1 + s];
        resolve_stream(a);
        if (seen != nullptr) {
            *seen = step[1 + s];
        }
    }
}
