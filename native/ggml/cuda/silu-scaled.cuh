// CUDA kernel of PYQSA_GGML_OP_SILU_SCALED (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"
#include "ggml-cuda/unary.cuh"

void pyqsa_cuda_silu_scaled(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
