// CUDA kernel of PYQSA_GGML_OP_RMS_NORM_GATED (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_rms_norm_gated(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
