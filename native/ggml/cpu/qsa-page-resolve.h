// CPU kernel of PYQSA_GGML_OP_QSA_PAGE_RESOLVE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_qsa_page_resolve(const struct ggml_compute_params * params, struct ggml_tensor * dst);
