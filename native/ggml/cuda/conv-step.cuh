// CUDA kernel of PYQSA_GGML_OP_CONV_STEP (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

bool pyqsa_cuda_conv_step_supported(const ggml_tensor * op);  // kernels of 2-8 taps
void pyqsa_cuda_conv_step(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// node i of cgraph is a PYQSA_GGML_OP_GDN_GATES and the next node but views a CONV_STEP (as
// qwen4exp's decode step builds them, ggml_patches/0022): runs both as one launch whose first
// blocks are conv_step's and the rest the gates' (each element as the op's own kernel computes
// it: the same bits) and returns how many nodes after i it ran; else 0, having run nothing (one
// reads what the other writes). Off (read at every call) with PYQSA_CUDA_GDN_CONV_APART=1.
int pyqsa_cuda_gdn_conv_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);
