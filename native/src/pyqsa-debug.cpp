// pyqsa C API: debug views of tensors seen by llama's cb_eval (see native/include/pyqsa.h).
#include "pyqsa.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cstdio>
#include <vector>

int32_t pyqsa_tensor_view_get(const void * t, pyqsa_tensor_view * out) {
    if (t == nullptr || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const auto * tensor = static_cast<const ggml_tensor *>(t);
    std::snprintf(out->name, sizeof(out->name), "%s", tensor->name);
    out->type = (int32_t) tensor->type;
    for (int i = 0; i < 4; ++i) {
        out->ne[i] = tensor->ne[i];
    }
    return PYQSA_OK;
}

int32_t pyqsa_tensor_read_f32(const void * t, float * dst, int64_t n) {
    if (t == nullptr || dst == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const auto * tensor = static_cast<const ggml_tensor *>(t);
    if (!ggml_is_contiguous(tensor)) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const int64_t ne = ggml_nelements(tensor);
    if (n < ne) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    switch (tensor->type) {
        case GGML_TYPE_F32:
            ggml_backend_tensor_get(tensor, dst, 0, ne * sizeof(float));
            return PYQSA_OK;
        case GGML_TYPE_I32: {
            std::vector<int32_t> tmp(ne);
            ggml_backend_tensor_get(tensor, tmp.data(), 0, ne * sizeof(int32_t));
            for (int64_t i = 0; i < ne; ++i) {
                dst[i] = (float) tmp[i];
            }
            return PYQSA_OK;
        }
        case GGML_TYPE_F16: {
            std::vector<ggml_fp16_t> tmp(ne);
            ggml_backend_tensor_get(tensor, tmp.data(), 0, ne * sizeof(ggml_fp16_t));
            ggml_fp16_to_fp32_row(tmp.data(), dst, ne);
            return PYQSA_OK;
        }
        case GGML_TYPE_BF16: {
            std::vector<ggml_bf16_t> tmp(ne);
            ggml_backend_tensor_get(tensor, tmp.data(), 0, ne * sizeof(ggml_bf16_t));
            ggml_bf16_to_fp32_row(tmp.data(), dst, ne);
            return PYQSA_OK;
        }
        default:
            return PYQSA_ERR_UNSUPPORTED;
    }
}
