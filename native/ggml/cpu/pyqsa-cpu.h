// CPU dispatch of GGML_OP_PYQSA (called from the patched ggml-cpu.c, which is C).
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

void pyqsa_cpu_forward(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
