// Row copies of the CPU paging kernels between a host store and device rows of another type
// (pyqsa_ggml_qsa_page_set_store_type): a q8_0 store's blocks into f16 rows, f32 rows into q8_0.
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

// one block row of n elements from the store (store_type) into the device rows (rows_type)
void pyqsa_cpu_page_fetch_row(void * dst, ggml_type rows_type, const void * src, ggml_type store_type, int64_t n);

// one row of n elements from the device rows (rows_type) into the store (store_type)
void pyqsa_cpu_page_write_row(void * dst, ggml_type store_type, const void * src, ggml_type rows_type, int64_t n);
