// CUDA kernel of PYQSA_GGML_OP_ADD_GATED (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_add_gated(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// one element: base plus x times its row's gate g, the gate with the formula of upstream's
// sigmoid kernel (unary.cu, built with the same flags), the product and the sum each rounded (no
// FMA), as upstream's mul and add kernels round them (also where hc_down computes the block's
// output itself, hc-mix.cu)
static __device__ __forceinline__ float add_gated_element(float base, float x, float g) {
    const float w = 1.0f / (1.0f + expf(-g));
    return __fadd_rn(base, __fmul_rn(x, w));
}
