// CUDA kernel of PYQSA_GGML_OP_GDN_GATES (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_gdn_gates(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
