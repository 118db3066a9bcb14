// CUDA kernel of PYQSA_GGML_OP_QSA_SCORE_SUM (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

bool pyqsa_cuda_qsa_score_sum_supported(const ggml_tensor * op);
void pyqsa_cuda_qsa_score_sum(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
