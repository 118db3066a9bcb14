// CPU kernel of PYQSA_GGML_OP_HC_COMBINE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_hc_combine(const struct ggml_compute_params * params, struct ggml_tensor * dst);
