// CUDA kernel of PYQSA_GGML_OP_HC_COMBINE (see native/include/pyqsa-ggml.h).
#pragma once

#include "add-gated.cuh"

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_hc_combine(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// a combine's inputs as a kernel reads them: its own, and hc_down's where it computes its streams
// (hc-mix.cu)
struct hc_combine_in {
    const float * out;       // [n_embd, n_tokens]: the block's output or the join's base (nullptr:
                             // no combine, for hc_down)
    const float * residual;  // [n_embd, hc, n_tokens]
    const float * inject;    // [hc, n_tokens]
    const float * joined;    // [n_embd, n_tokens]: the gated form's join x (nullptr: none)
    const float * gate;      // [1, n_tokens]: its g
    float         scale;
    int64_t       so1, sr1, sr2, si0, si1, sj1, sg1;  // strides in floats
};

// the inputs of comb, a PYQSA_GGML_OP_HC_COMBINE node
hc_combine_in pyqsa_cuda_hc_combine_in(const ggml_tensor * comb);

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

// the block's output at element e of token t: read, or in the gated form computed as add_gated's
// kernel computes it
static __device__ __forceinline__ float hc_block_output(const hc_combine_in & in, int64_t e, int64_t t) {
    const float o = in.out[e + t * in.so1];
    return in.joined ? add_gated_element(o, in.joined[e + t * in.sj1], in.gate[t * in.sg1]) : o;
}
