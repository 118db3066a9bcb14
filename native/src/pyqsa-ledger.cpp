// Bytes of a context by category (see pyqsa_ledger_get in pyqsa.h): llama.cpp's own per-buffer
// breakdowns, split by what the buffers hold (weights, the memory's sub-caches, compute) and
// by where they live.
#include "pyqsa.h"

#include "cuda-proc.h"
#include "ggml-backend.h"

#include "llama-context.h"
#include "llama-ext.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid-idx.h"
#include "llama-memory-recurrent.h"
#include "llama-model.h"
#include "pyqsa-lazy-host.h"
#include "qsa-pager.h"

#include <map>

namespace {

using breakdown = std::map<ggml_backend_buffer_type_t, size_t>;

const pyqsa_kv_pager * pager_of(const llama_context * ctx) {
    const auto * hyb = dynamic_cast<const llama_memory_hybrid *>(llama_get_memory(const_cast<llama_context *>(ctx)));
    return hyb ? hyb->get_mem_attn()->get_pyqsa_pager() : nullptr;
}

// memory held: a lazily committed buffer (a paging context's unread indexer cache) counts the
// pages it holds, not what it reserved
void add(const breakdown & b, uint64_t pyqsa_ledger::*field, pyqsa_ledger * device, pyqsa_ledger * host) {
    for (const auto & [buft, size] : b) {
        (ggml_backend_buft_is_host(buft) ? host : device)->*field += pyqsa_lazy_host_held(buft, size);
    }
}

// a process-wide figure of the CUDA backend ("pyqsa_cuda_pool_bytes", "pyqsa_cuda_stack_bytes");
// 0 without one
uint64_t cuda_bytes(const char * name) {
    auto * fn = pyqsa_cuda_proc<uint64_t()>(name);
    return fn ? fn() : 0;
}

}  // namespace

int32_t pyqsa_ledger_get(const void * ctx_v, pyqsa_ledger * device, pyqsa_ledger * host) {
    if (ctx_v == nullptr || device == nullptr || host == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const auto * ctx = static_cast<const llama_context *>(ctx_v);
    *device = {};
    *host   = {};
    add(ctx->get_model().memory_breakdown(), &pyqsa_ledger::weights, device, host);

    const llama_memory_i * mem = llama_get_memory(const_cast<llama_context *>(ctx));
    if (const auto * hyb = dynamic_cast<const llama_memory_hybrid *>(mem)) {
        add(hyb->get_mem_attn()->memory_breakdown(), &pyqsa_ledger::kv, device, host);
        add(hyb->get_mem_recr()->memory_breakdown(), &pyqsa_ledger::recurrent, device, host);
        if (const auto * idx = dynamic_cast<const llama_memory_hybrid_idx *>(mem); idx && idx->get_mem_idx()) {
            add(idx->get_mem_idx()->memory_breakdown(), &pyqsa_ledger::indexer, device, host);
        }
    } else if (mem != nullptr) {
        add(mem->memory_breakdown(), &pyqsa_ledger::kv, device, host);
    }

    breakdown compute;
    for (const auto & [buft, data] : llama_get_memory_breakdown(ctx)) {
        compute[buft] += data.compute;
    }
    add(compute, &pyqsa_ledger::compute, device, host);
    if (const pyqsa_kv_pager * pager = pager_of(ctx)) {
        using part = pyqsa_kv_pager::part;
        add(pager->memory_breakdown(part::hot), &pyqsa_ledger::hot, device, host);
        add(pager->memory_breakdown(part::staging), &pyqsa_ledger::staging, device, host);
        add(pager->memory_breakdown(part::tail), &pyqsa_ledger::tail, device, host);
        add(pager->memory_breakdown(part::keys), &pyqsa_ledger::indexer, device, host);
    }
    device->pool  = cuda_bytes("pyqsa_cuda_pool_bytes");
    device->stack = cuda_bytes("pyqsa_cuda_stack_bytes");
    return PYQSA_OK;
}

namespace {

// the counters of ctx's pager once the device has finished its work; PYQSA_ERR_UNSUPPORTED in
// *rc when the context does not page
pyqsa_kv_pager_counters synced_counters(const void * ctx_v, int32_t * rc, int64_t * hot_blocks) {
    const auto *           ctx   = static_cast<const llama_context *>(ctx_v);
    const pyqsa_kv_pager * pager = pager_of(ctx);
    if (pager == nullptr) {
        *rc = PYQSA_ERR_UNSUPPORTED;
        return {};
    }
    llama_synchronize(const_cast<llama_context *>(ctx));
    *rc         = PYQSA_OK;
    *hot_blocks = pager->hot_blocks();
    return pager->counters();
}

}  // namespace

int32_t pyqsa_paging_stats_get(const void * ctx_v, pyqsa_paging_stats * out) {
    if (ctx_v == nullptr || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    int32_t                       rc  = PYQSA_OK;
    int64_t                       hot = 0;
    const pyqsa_kv_pager_counters c   = synced_counters(ctx_v, &rc, &hot);
    if (rc == PYQSA_OK) {
        *out = { c.hits, c.misses, c.staged, c.bytes_to_device, c.bytes_to_host, hot };
    }
    return rc;
}

int32_t pyqsa_paging_layer_get(const void * ctx_v, int32_t i, int32_t * il, uint64_t * hits, uint64_t * misses) {
    if (ctx_v == nullptr || il == nullptr || hits == nullptr || misses == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    int32_t                       rc  = PYQSA_OK;
    int64_t                       hot = 0;
    const pyqsa_kv_pager_counters c   = synced_counters(ctx_v, &rc, &hot);
    if (rc != PYQSA_OK) {
        return rc;
    }
    if (i < 0 || (size_t) i >= c.layers.size()) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    *il     = (int32_t) c.layers[i][0];
    *hits   = c.layers[i][1];
    *misses = c.layers[i][2];
    return PYQSA_OK;
}
