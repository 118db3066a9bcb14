// CPU dispatch of GGML_OP_PYQSA (called from the patched ggml-cpu.c, which is C).
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

void pyqsa_cpu_forward(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// the work buffer a pyqsa op needs (ggml_graph_plan's, shared by its threads), in bytes
size_t pyqsa_cpu_work_size(const struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
