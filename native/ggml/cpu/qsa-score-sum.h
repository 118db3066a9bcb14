// CPU kernel of PYQSA_GGML_OP_QSA_SCORE_SUM (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_qsa_score_sum(const struct ggml_compute_params * params, struct ggml_tensor * dst);
