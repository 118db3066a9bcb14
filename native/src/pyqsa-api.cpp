// pyqsa C API: version, build and device queries (see native/include/pyqsa.h).
#include "pyqsa.h"

#include "cuda-proc.h"
#include "ggml-backend.h"
#include "pyqsa-ggml.h"

#include <cstdio>
#include <cstring>

#ifndef PYQSA_VERSION
#    error "PYQSA_VERSION must be defined by native/llama.cmake"
#endif

namespace {

void copy_str(char * dst, size_t cap, const char * src) {
    std::snprintf(dst, cap, "%s", src ? src : "");
}

}  // namespace

const char * pyqsa_version(void) {
    return "pyqsa " PYQSA_VERSION " (llama.cpp " PYQSA_UPSTREAM_COMMIT ")";
}

int32_t pyqsa_build_info_get(pyqsa_build_info * out) {
    if (out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    out->version         = PYQSA_VERSION;
    out->upstream_commit = PYQSA_UPSTREAM_COMMIT;
#ifdef PYQSA_HAS_CUDA
    out->has_cuda   = 1;
    out->cuda_archs = PYQSA_CUDA_ARCHS;
#else
    out->has_cuda   = 0;
    out->cuda_archs = "";
#endif
    return PYQSA_OK;
}

int32_t pyqsa_device_count(void) {
    return (int32_t) ggml_backend_dev_count();
}

int32_t pyqsa_device_info_get(int32_t i, pyqsa_device_info * out) {
    if (out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    if (i < 0 || (size_t) i >= ggml_backend_dev_count()) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    ggml_backend_dev_t dev = ggml_backend_dev_get((size_t) i);
    copy_str(out->name, sizeof(out->name), ggml_backend_dev_name(dev));
    copy_str(out->description, sizeof(out->description), ggml_backend_dev_description(dev));
    out->type = (int32_t) ggml_backend_dev_type(dev);
    size_t free_b = 0, total_b = 0;
    ggml_backend_dev_memory(dev, &free_b, &total_b);
    out->memory_free  = free_b;
    out->memory_total = total_b;
    return PYQSA_OK;
}

int32_t pyqsa_cuda_graph_counts_get(uint64_t out[3]) {
    if (out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    auto * fn = pyqsa_cuda_proc<void(uint64_t *)>("pyqsa_cuda_graph_counts");
    if (fn == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    fn(out);
    return PYQSA_OK;
}

int32_t pyqsa_cuda_stack_reserve(int32_t device, uint64_t min_per_thread) {
    auto * fn = pyqsa_cuda_proc<bool(int, size_t)>("pyqsa_cuda_stack_raise");
    if (fn == nullptr) {
        return PYQSA_ERR_UNSUPPORTED;
    }
    return fn(device, (size_t) min_per_thread) ? PYQSA_OK : PYQSA_ERR_OUT_OF_RANGE;
}

bool pyqsa_abort_flag_is_set(void * flag) {
    // relaxed: the flag only asks the compute loop to stop; it orders no other memory
    return flag != nullptr &&
           __atomic_load_n(static_cast<const int32_t *>(flag), __ATOMIC_RELAXED) != 0;
}

int32_t pyqsa_sample(const float * logits, int64_t n_vocab, const pyqsa_sample_params * params,
                     const pyqsa_logit_adjust * adjust, int64_t n_adjust, pyqsa_sample_result * out) {
    if (logits == nullptr || params == nullptr || out == nullptr || n_vocab < 1 || n_vocab > INT32_MAX ||
        params->n_top < -1 || params->n_top > 20 || n_adjust < 0 || (n_adjust > 0 && adjust == nullptr)) {
        return PYQSA_ERR_INVALID_ARG;
    }
    pyqsa_sample_row(logits, n_vocab, params, adjust, n_adjust, out);
    return PYQSA_OK;
}
