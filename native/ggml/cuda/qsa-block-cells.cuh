// CUDA kernel of PYQSA_GGML_OP_QSA_BLOCK_CELLS (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_qsa_block_cells(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
