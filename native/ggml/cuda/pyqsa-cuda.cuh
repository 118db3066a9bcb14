// CUDA dispatch of GGML_OP_PYQSA (called from the patched ggml-cuda.cu).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_supports_op(const ggml_tensor * op);

// node i of cgraph is a GGML_OP_PYQSA: runs it with the nodes after it that one launch can take
// too and returns how many nodes after i it ran, or returns 0 having run nothing (called from
// the patched ggml_cuda_try_fuse)
int pyqsa_cuda_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);

// whether the GPU can read p in place: device or pinned host memory, not pageable
bool pyqsa_cuda_host_mapped(const void * p);
