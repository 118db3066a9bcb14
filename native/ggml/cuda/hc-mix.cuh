// CUDA kernels of PYQSA_GGML_OP_HC_DOWN and PYQSA_GGML_OP_HC_PRE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"
#include "pyqsa-ggml.h"

// up to PYQSA_HC_MIX_MAX_TOKENS tokens and PYQSA_HC_MIX_MAX_STREAMS streams (pyqsa-ggml.h)

bool pyqsa_cuda_hc_mix_supported(const ggml_tensor * op);
void pyqsa_cuda_hc_down(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void pyqsa_cuda_hc_pre(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Node i of cgraph is a PYQSA_GGML_OP_HC_COMBINE and node i + 1 the HC_DOWN that reads it, or
// node i an ADD_GATED read by that combine alone at i + 1 and the HC_DOWN at i + 2: runs them as
// one launch of hc_down, which computes x from the combine's (and the add_gated's) inputs, each
// element as their kernels do (the same bits), and stores it as the combine's result (the
// add_gated's is not stored); returns how many nodes after i it ran, else 0 having run nothing.
// That launch, or hc_down's after the combine's own, also fetches the w_up of the HC_PRE that
// follows into L2. Read at every call: PYQSA_CUDA_HC_COMBINE_APART=1 runs the combine (and the
// add_gated) a launch of its own, PYQSA_CUDA_ADD_GATED_APART=1 the add_gated alone,
// PYQSA_CUDA_HC_NO_PREFETCH=1 fetches nothing ahead.
int pyqsa_cuda_hc_down_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);
