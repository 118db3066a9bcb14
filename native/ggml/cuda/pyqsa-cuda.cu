// CUDA dispatch of GGML_OP_PYQSA on the sub-op in op_params[0].
#include "pyqsa-cuda.cuh"
#include "add-gated.cuh"
#include "conv-step.cuh"
#include "gdn-gates.cuh"
#include "gdn-prefill.cuh"
#include "gemv-f16.cuh"
#include "hc-combine.cuh"
#include "hc-mix.cuh"
#include "product-groups.cuh"
#include "pyqsa-cuda-moe.h"
#include "pyqsa-cuda-precision.h"

#include "pyqsa-env.h"
#include "pyqsa-ggml.h"
#include "qsa-attn.cuh"
#include "qsa-attn-part.cuh"
#include "qsa-block-cells.cuh"
#include "qsa-mask-cells.cuh"
#include "qsa-page-fetch.cuh"
#include "qsa-page-resolve.cuh"
#include "qsa-page-stage.cuh"
#include "qsa-page-write.cuh"
#include "qsa-score.cuh"
#include "qsa-topk.cuh"
#include "rms-norm-gated.cuh"
#include "sample.cuh"
#include "silu-scaled.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

void pyqsa_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (ggml_get_op_params_i32(dst, 0)) {
        case PYQSA_GGML_OP_QSA_ATTN:
            pyqsa_cuda_qsa_attn(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_MASK_CELLS:
            pyqsa_cuda_qsa_mask_cells(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_TOPK:
            pyqsa_cuda_qsa_topk(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_BLOCK_CELLS:
            pyqsa_cuda_qsa_block_cells(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_SCORE:
            pyqsa_cuda_qsa_score(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_RESOLVE:
            pyqsa_cuda_qsa_page_resolve(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_STAGE:
            pyqsa_cuda_qsa_page_stage(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_WRITE:
            pyqsa_cuda_qsa_page_write(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_ATTN_PART:
            pyqsa_cuda_qsa_attn_part(ctx, dst);
            break;
        case PYQSA_GGML_OP_SAMPLE:
            pyqsa_cuda_sample(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_FETCH:
            pyqsa_cuda_qsa_page_fetch(ctx, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_FETCH_WAIT:
            pyqsa_cuda_qsa_page_fetch_wait(ctx, dst);
            break;
        case PYQSA_GGML_OP_HC_COMBINE:
            pyqsa_cuda_hc_combine(ctx, dst);
            break;
        case PYQSA_GGML_OP_SILU_SCALED:
            pyqsa_cuda_silu_scaled(ctx, dst);
            break;
        case PYQSA_GGML_OP_GDN_GATES:
            pyqsa_cuda_gdn_gates(ctx, dst);
            break;
        case PYQSA_GGML_OP_ADD_GATED:
            pyqsa_cuda_add_gated(ctx, dst);
            break;
        case PYQSA_GGML_OP_CONV_STEP:
            pyqsa_cuda_conv_step(ctx, dst);
            break;
        case PYQSA_GGML_OP_RMS_NORM_GATED:
            pyqsa_cuda_rms_norm_gated(ctx, dst);
            break;
        case PYQSA_GGML_OP_HC_DOWN:
            pyqsa_cuda_hc_down(ctx, dst);
            break;
        case PYQSA_GGML_OP_HC_PRE:
            pyqsa_cuda_hc_pre(ctx, dst);
            break;
        default:
            GGML_ABORT("pyqsa: unknown sub-op %d", ggml_get_op_params_i32(dst, 0));
    }
}

bool pyqsa_cuda_supports_op(const ggml_tensor * op) {
    switch (ggml_get_op_params_i32(op, 0)) {
        case PYQSA_GGML_OP_QSA_ATTN:
            return pyqsa_cuda_qsa_attn_supported(op);
        case PYQSA_GGML_OP_QSA_MASK_CELLS:
            return op->src[0]->ne[1] * op->src[0]->ne[3] <= 65535;
        case PYQSA_GGML_OP_QSA_SCORE:
            return pyqsa_cuda_qsa_score_supported(op);
        case PYQSA_GGML_OP_QSA_PAGE_RESOLVE:
            return pyqsa_cuda_qsa_page_resolve_supported(op);
        case PYQSA_GGML_OP_QSA_PAGE_STAGE:
            return pyqsa_cuda_qsa_page_stage_supported(op);
        case PYQSA_GGML_OP_QSA_PAGE_WRITE:
            return pyqsa_cuda_qsa_page_write_supported(op);
        case PYQSA_GGML_OP_QSA_ATTN_PART:
            return pyqsa_cuda_qsa_attn_part_supported(op);
        case PYQSA_GGML_OP_SAMPLE:
            return pyqsa_cuda_sample_supported(op);
        case PYQSA_GGML_OP_QSA_PAGE_FETCH:
            return pyqsa_cuda_qsa_page_fetch_supported(op);
        case PYQSA_GGML_OP_QSA_PAGE_FETCH_WAIT:
        case PYQSA_GGML_OP_HC_COMBINE:
        case PYQSA_GGML_OP_SILU_SCALED:
        case PYQSA_GGML_OP_GDN_GATES:
        case PYQSA_GGML_OP_ADD_GATED:
        case PYQSA_GGML_OP_RMS_NORM_GATED:
            return true;
        case PYQSA_GGML_OP_CONV_STEP:
            return pyqsa_cuda_conv_step_supported(op);
        case PYQSA_GGML_OP_HC_DOWN:
        case PYQSA_GGML_OP_HC_PRE:
            return pyqsa_cuda_hc_mix_supported(op);
        case PYQSA_GGML_OP_QSA_TOPK:
        case PYQSA_GGML_OP_QSA_BLOCK_CELLS:
            return ggml_nrows(op->src[0]) <= 65535;
        default:
            return false;
    }
}

int pyqsa_cuda_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * node = cgraph->nodes[i];
    switch (ggml_get_op_params_i32(node, 0)) {
        case PYQSA_GGML_OP_SAMPLE:
            return pyqsa_cuda_sample_fuse(ctx, cgraph, i);
        case PYQSA_GGML_OP_HC_COMBINE:
            return pyqsa_cuda_hc_combine_fuse(ctx, cgraph, i);
        case PYQSA_GGML_OP_GDN_GATES:
            return pyqsa_cuda_gdn_conv_fuse(ctx, cgraph, i);
        default:
            return 0;
    }
}

bool pyqsa_cuda_node_is_noop(const ggml_tensor * t) {
    return ggml_is_empty(t) || ggml_op_is_empty(t->op) || (t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0;
}

bool pyqsa_cuda_bytes_overlap(const ggml_tensor * a, const ggml_tensor * b) {
    if (a == nullptr || b == nullptr) {
        return false;
    }
    const char * a0 = (const char *) a->data;
    const char * b0 = (const char *) b->data;
    return a0 < b0 + ggml_nbytes(b) && b0 < a0 + ggml_nbytes(a);
}

bool pyqsa_cuda_strict_f32() {
    // read once: cuBLAS handles keep the math mode they were created with
    static const bool strict = pyqsa_env_switch_on("PYQSA_CUDA_STRICT_F32");
    return strict;
}

bool pyqsa_cuda_f16_products_f32() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_F16_ACCUMULATE");
}

bool pyqsa_cuda_moe_on_device() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_MOE_SYNC");
}

bool pyqsa_cuda_moe_grouped() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_MOE_MMF");
}

bool pyqsa_cuda_gdn_staged() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_GDN_UPSTREAM");
}

bool pyqsa_cuda_gemv_on() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_GEMV_UPSTREAM");
}

bool pyqsa_cuda_gemv_steps() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_GEMV_ONE_CHUNK");
}

bool pyqsa_cuda_products_grouped() {
    return !pyqsa_env_switch_on("PYQSA_CUDA_PRODUCTS_UNGROUPED");
}

int pyqsa_cuda_gdn_lanes() {
    const char * v = getenv("PYQSA_CUDA_GDN_LANES");
    return v != nullptr && strcmp(v, "32") == 0 ? 32 : 16;
}

bool pyqsa_cuda_host_mapped(const void * p) {
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void) cudaGetLastError();
        return false;
    }
    return attr.type != cudaMemoryTypeUnregistered;
}

namespace {

std::atomic<uint64_t> graph_computes[3];  // kernel by kernel, captured, replayed
std::atomic<int64_t>  pool_bytes;
// a device's per-thread stack when pyqsa_cuda_stack_raise first saw it (0: not counted) and
// the threads it holds at once
std::atomic<size_t>   stack_base[GGML_CUDA_MAX_DEVICES];
std::atomic<uint64_t> stack_threads[GGML_CUDA_MAX_DEVICES];

}  // namespace

void pyqsa_cuda_graph_count(bool use_graph, bool capture) {
    graph_computes[!use_graph ? 0 : capture ? 1 : 2].fetch_add(1, std::memory_order_relaxed);
}

void pyqsa_cuda_graph_counts(uint64_t * out) {
    for (int i = 0; i < 3; ++i) {
        out[i] = graph_computes[i].load(std::memory_order_relaxed);
    }
}

void pyqsa_cuda_pool_resized(int64_t delta) {
    pool_bytes.fetch_add(delta, std::memory_order_relaxed);
}

uint64_t pyqsa_cuda_pool_bytes() {
    return (uint64_t) std::max<int64_t>(0, pool_bytes.load(std::memory_order_relaxed));
}

// NOTE: the driver holds one stack for every thread a device can run at once, as large as the
// largest frame launched so far: a launch that needs more grows it for good (cuCtxSetLimit's
// CU_LIMIT_STACK_SIZE). Raised here before the first pass, that growth happens at start, where
// the budget sees it, rather than in the middle of a run.
bool pyqsa_cuda_stack_raise(int device, size_t min_per_thread) {
    if (device < 0 || device >= ggml_cuda_info().device_count) {
        return false;
    }
    ggml_cuda_set_device(device);
    size_t per_thread = 0;
    int    per_sm = 0, n_sm = 0;
    CUDA_CHECK(cudaDeviceGetLimit(&per_thread, cudaLimitStackSize));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device));
    stack_threads[device].store((uint64_t) per_sm * (uint64_t) n_sm, std::memory_order_relaxed);
    size_t unset = 0;
    stack_base[device].compare_exchange_strong(unset, per_thread, std::memory_order_relaxed);
    if (per_thread < min_per_thread) {
        CUDA_CHECK(cudaDeviceSetLimit(cudaLimitStackSize, min_per_thread));
    }
    return true;
}

uint64_t pyqsa_cuda_stack_bytes() {
    uint64_t total = 0;
    for (int d = 0; d < ggml_cuda_info().device_count; ++d) {
        const size_t base = stack_base[d].load(std::memory_order_relaxed);
        if (base == 0) {
            continue;
        }
        ggml_cuda_set_device(d);
        size_t per_thread = 0;
        CUDA_CHECK(cudaDeviceGetLimit(&per_thread, cudaLimitStackSize));
        total += (uint64_t) (per_thread - std::min(per_thread, base)) *
                 stack_threads[d].load(std::memory_order_relaxed);
    }
    return total;
}
