// CUDA kernel of PYQSA_GGML_OP_HC_COMBINE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_hc_combine(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
