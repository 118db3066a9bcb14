// The CUDA backend's pyqsa functions (native/ggml/cuda/pyqsa-cuda.cuh), found by name through its
// get_proc_address: libllama reaches the backend only through ggml's registry, and may have none.
#pragma once

#include "ggml-backend.h"

// the function `name` of the CUDA backend, or nullptr without one
template <typename Fn> Fn * pyqsa_cuda_proc(const char * name) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CUDA");
    return reinterpret_cast<Fn *>(reg ? ggml_backend_reg_get_proc_address(reg, name) : nullptr);
}
