// CUDA kernel of PYQSA_GGML_OP_HC_COMBINE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_hc_combine(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// one element of the combine: a stream's residual r plus the block's output x times the stream's
// weight from its scatter logit. ggml_scale, ggml_sigmoid, ggml_scale by 2 and dsv4_hc_post's sum
// in their expressions, so the same flags give the same bits (also where hc_down computes its
// streams itself, hc-mix.cu)
static __device__ __forceinline__ float hc_combine_element(float x, float r, float inject, float scale) {
    const float s   = inject * scale;
    const float sg  = 1.0f / (1.0f + expf(-s));
    const float w   = sg * 2.0f;
    float       sum = x * w;
    sum += r;
    return sum;
}
