// CUDA kernels of PYQSA_GGML_OP_QSA_PAGE_FETCH and _FETCH_WAIT (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_qsa_page_fetch(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void pyqsa_cuda_qsa_page_fetch_wait(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_page_fetch_supported(const ggml_tensor * op);
