// CUDA kernels of PYQSA_GGML_OP_QSA_PAGE_RESOLVE, _PAGE_STAGE and _PAGE_WRITE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

// largest hot cache (slots per stream) the kernel takes: its sort keys sit in shared memory
constexpr int PYQSA_PAGE_MAX_SLOTS = 2048;

void pyqsa_cuda_qsa_page_resolve(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_page_resolve_supported(const ggml_tensor * op);

// PYQSA_GGML_OP_QSA_PAGE_STAGE
void pyqsa_cuda_qsa_page_stage(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_page_stage_supported(const ggml_tensor * op);

// PYQSA_GGML_OP_QSA_PAGE_WRITE
void pyqsa_cuda_qsa_page_write(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_page_write_supported(const ggml_tensor * op);
