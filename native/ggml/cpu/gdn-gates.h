// CPU kernel of PYQSA_GGML_OP_GDN_GATES (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_gdn_gates(const struct ggml_compute_params * params, struct ggml_tensor * dst);
