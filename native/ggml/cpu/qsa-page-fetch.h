// CPU kernels of PYQSA_GGML_OP_QSA_PAGE_FETCH and _FETCH_WAIT (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_qsa_page_fetch(const struct ggml_compute_params * params, struct ggml_tensor * dst);
