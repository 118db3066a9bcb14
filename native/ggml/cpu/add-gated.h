// CPU kernel of PYQSA_GGML_OP_ADD_GATED (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

#include <math.h>

struct ggml_compute_params;

void pyqsa_cpu_add_gated(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// a row's gate weight, ggml_sigmoid's
static inline float pyqsa_gate_weight(float g) {
    return 1.f / (1.f + expf(-g));
}

// base plus x times the row's weight w: ggml_mul then ggml_add, each rounded (the native CPU files
// are built with -ffp-contract=off); also the gated combine's block output (hc-combine.cpp)
static inline float pyqsa_add_gated_element(float base, float x, float w) {
    const float prod = x * w;
    return base + prod;
}
