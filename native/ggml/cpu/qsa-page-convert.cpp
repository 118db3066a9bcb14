// Row copies of the CPU paging kernels (see qsa-page-convert.h).
#include "qsa-page-convert.h"

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <cstring>
#include <vector>

void pyqsa_cpu_page_fetch_row(void * dst, ggml_type rows_type, const void * src, ggml_type store_type, int64_t n) {
    if (rows_type == store_type) {
        std::memcpy(dst, src, ggml_row_size(rows_type, n));
        return;
    }
    // d * q in f32 (exact: an f16 scale times an 8-bit integer), then rounded to f16, as CUDA does
    GGML_ASSERT(store_type == GGML_TYPE_Q8_0 && rows_type == GGML_TYPE_F16);
    thread_local std::vector<float> f32;
    f32.resize(n);
    ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(src, f32.data(), n);
    ggml_fp32_to_fp16_row(f32.data(), (ggml_fp16_t *) dst, n);
}

void pyqsa_cpu_page_write_row(void * dst, ggml_type store_type, const void * src, ggml_type rows_type, int64_t n) {
    if (rows_type == store_type) {
        std::memcpy(dst, src, ggml_row_size(rows_type, n));
        return;
    }
    // the CPU set_rows's own quantization, so the store holds what an unpaged q8_0 cache would
    GGML_ASSERT(store_type == GGML_TYPE_Q8_0 && rows_type == GGML_TYPE_F32);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float((const float *) src, dst, n);
}
