// The rows of a ggml tensor for the CPU kernels, through the tensor's own strides.
#pragma once

#include "ggml.h"

// the f32 row at a flat row index of t (dims 1, 2 and 3 in ggml's order)
inline float * pyqsa_row_f32(const struct ggml_tensor * t, int64_t row) {
    const int64_t i1 = row % t->ne[1], i2 = (row / t->ne[1]) % t->ne[2], i3 = row / (t->ne[1] * t->ne[2]);
    return (float *) ((char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]);
}
