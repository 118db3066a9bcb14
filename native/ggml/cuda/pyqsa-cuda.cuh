// CUDA dispatch of GGML_OP_PYQSA (called from the patched ggml-cuda.cu).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_supports_op(const ggml_tensor * op);

// whether the GPU can read p in place: device or pinned host memory, not pageable
bool pyqsa_cuda_host_mapped(const void * p);
