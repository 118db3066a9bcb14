// CUDA kernel of PYQSA_GGML_OP_CONV_STEP (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

bool pyqsa_cuda_conv_step_supported(const ggml_tensor * op);  // kernels of 2-8 taps
void pyqsa_cuda_conv_step(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
