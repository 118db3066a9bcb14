// CPU kernel of PYQSA_GGML_OP_CONV_STEP (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

#include <stddef.h>

struct ggml_compute_params;

// the bytes of the work buffer the kernel needs (the windows it convolves)
size_t pyqsa_cpu_conv_step_work_size(const struct ggml_tensor * dst);
void   pyqsa_cpu_conv_step(const struct ggml_compute_params * params, struct ggml_tensor * dst);
