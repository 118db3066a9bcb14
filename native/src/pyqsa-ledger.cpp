// Bytes of a context by category (see pyqsa_ledger_get in pyqsa.h): llama.cpp's own per-buffer
// breakdowns, split by what the buffers hold (weights, the memory's sub-caches, compute) and
// by where they live.
#include "pyqsa.h"

#include "llama-context.h"
#include "llama-ext.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid-idx.h"
#include "llama-memory-recurrent.h"
#include "llama-model.h"

#include <map>

namespace {

using breakdown = std::map<ggml_backend_buffer_type_t, size_t>;

void add(const breakdown & b, uint64_t pyqsa_ledger::*field, pyqsa_ledger * device, pyqsa_ledger * host) {
    for (const auto & [buft, size] : b) {
        (ggml_backend_buft_is_host(buft) ? host : device)->*field += size;
    }
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
    return PYQSA_OK;
}
