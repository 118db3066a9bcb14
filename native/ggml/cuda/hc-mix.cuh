// CUDA kernels of PYQSA_GGML_OP_HC_DOWN and PYQSA_GGML_OP_HC_PRE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"
#include "pyqsa-ggml.h"

// up to PYQSA_HC_MIX_MAX_TOKENS tokens and PYQSA_HC_MIX_MAX_STREAMS streams (pyqsa-ggml.h)

bool pyqsa_cuda_hc_mix_supported(const ggml_tensor * op);
void pyqsa_cuda_hc_down(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void pyqsa_cuda_hc_pre(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// node i of cgraph is a PYQSA_GGML_OP_HC_COMBINE and node i + 1 the HC_DOWN that reads it: runs
// both as one launch of hc_down, which computes x from the combine's inputs (each element as the
// combine's kernel does: the same bits) and stores it as the combine's result, and returns 1;
// else 0, having run nothing. Off (read at every call) with PYQSA_CUDA_HC_COMBINE_APART=1.
int pyqsa_cuda_hc_combine_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);
