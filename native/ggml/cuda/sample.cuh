// CUDA kernel of PYQSA_GGML_OP_SAMPLE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_sample(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool pyqsa_cuda_sample_supported(const ggml_tensor * op);
