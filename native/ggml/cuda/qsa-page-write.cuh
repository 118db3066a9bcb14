// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_WRITE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_qsa_page_write(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_page_write_supported(const ggml_tensor * op);
