// CPU kernels of PYQSA_GGML_OP_HC_DOWN and PYQSA_GGML_OP_HC_PRE, the two halves of a
// hyper-connection mix (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

#include <stddef.h>

struct ggml_compute_params;

size_t pyqsa_cpu_hc_down_work_size(const struct ggml_tensor * dst);
void   pyqsa_cpu_hc_down(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void   pyqsa_cpu_hc_pre(const struct ggml_compute_params * params, struct ggml_tensor * dst);
