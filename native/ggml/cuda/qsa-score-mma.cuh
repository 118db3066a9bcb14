#pragma once

#include "ggml-cuda/common.cuh"
#include "pyqsa-ggml.h"

// QSA_SCORE's result for dst on tensor cores when the call suits them (at least
// PYQSA_GGML_QSA_SCORE_CUDA_MMA_MIN_TPS queries per stream, D = 32, 64, 128 or 256, n_head = 1, 2,
// 4 or 8 (8 up to D = 128), 16-byte aligned rows, sm_80 or later); false, having done nothing,
// otherwise
bool pyqsa_cuda_qsa_score_mma(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);
