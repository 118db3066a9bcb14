// CPU kernel of PYQSA_GGML_OP_SILU_SCALED (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_silu_scaled(const struct ggml_compute_params * params, struct ggml_tensor * dst);
