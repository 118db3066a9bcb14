// CPU kernels of PYQSA_GGML_OP_QSA_PAGE_RESOLVE, _PAGE_STAGE and _PAGE_WRITE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml.h"

struct ggml_compute_params;

void pyqsa_cpu_qsa_page_resolve(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// PYQSA_GGML_OP_QSA_PAGE_STAGE
void pyqsa_cpu_qsa_page_stage(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// PYQSA_GGML_OP_QSA_PAGE_WRITE
void pyqsa_cpu_qsa_page_write(const struct ggml_compute_params * params, struct ggml_tensor * dst);
