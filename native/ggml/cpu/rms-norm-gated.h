// CPU kernel of PYQSA_GGML_OP_RMS_NORM_GATED (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_rms_norm_gated(const struct ggml_compute_params * params, struct ggml_tensor * dst);
