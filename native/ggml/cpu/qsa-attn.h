// CPU kernel of PYQSA_GGML_OP_QSA_ATTN (see native/include/pyqsa-ggml.h), and the steps it shares
// with qsa_attn_part's kernel, so that chained passes give its bits.
#pragma once

#include "ggml.h"

#include <cmath>
#include <cstdint>

struct ggml_compute_params;

void pyqsa_cpu_qsa_attn(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// row of D values of k or v (any supported type) as f32
void pyqsa_cpu_attn_load_row(const ggml_tensor * t, const char * row, float * out, int64_t D);

// One query head's online softmax, accumulated in f32: the running max m, sum l and weighted sum
// acc[D] of the cells added so far.
struct pyqsa_cpu_attn_state {
    float   m = -INFINITY;
    float   l = 0.0f;
    float * acc;

    // one cell: krow and vrow as f32 (vrow is read only after the weights are known)
    void add(const float * qrow, const float * krow, const float * vrow, int64_t D, float scale);
};
