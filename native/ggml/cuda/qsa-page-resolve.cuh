// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_RESOLVE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

// largest hot cache (slots per stream) the kernel takes: its sort keys and misses sit in shared
// memory, 12 bytes a slot (96 KiB at 8192, within what sm_80+ lets a block opt in to)
constexpr int PYQSA_PAGE_MAX_SLOTS = 8192;

void pyqsa_cuda_qsa_page_resolve(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_qsa_page_resolve_supported(const ggml_tensor * op);
