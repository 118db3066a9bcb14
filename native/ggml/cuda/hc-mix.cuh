// CUDA kernels of PYQSA_GGML_OP_HC_DOWN and PYQSA_GGML_OP_HC_PRE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"
#include "pyqsa-ggml.h"

// up to PYQSA_HC_MIX_MAX_TOKENS tokens and PYQSA_HC_MIX_MAX_STREAMS streams (pyqsa-ggml.h)

bool pyqsa_cuda_hc_mix_supported(const ggml_tensor * op);
void pyqsa_cuda_hc_down(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void pyqsa_cuda_hc_pre(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
