// CUDA kernel of PYQSA_GGML_OP_QSA_ATTN_PART (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_qsa_attn_part(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_attn_part_supported(const ggml_tensor * op);
