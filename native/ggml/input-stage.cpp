// The scheduler's queued copies of host inputs (see native/include/pyqsa-input-stage.h).
#include "pyqsa-input-stage.h"

#include "ggml-backend-impl.h"
#include "pyqsa-env.h"

#include <cstring>

struct pyqsa_input_stage {
    ggml_backend_buffer_t buf  = nullptr;  // the device's pinned host memory (nullptr: none to be had)
    size_t                used = 0;        // bytes queued for copies since the last wait
};

namespace {

constexpr size_t STAGE_BYTES = 4u << 20;  // a decode step's inputs take ~100 KiB
constexpr size_t MAX_TENSOR  = 1u << 20;  // larger ones: one synchronous copy costs less than a copy here first
constexpr size_t ALIGN       = 256;

ggml_backend_buffer_t buffer_of(const ggml_tensor * t) {
    return t->view_src != nullptr ? t->view_src->buffer : t->buffer;
}

bool takes(ggml_backend_t backend, const ggml_tensor * src, const ggml_tensor * dst) {
    static const bool off = pyqsa_env_switch_on("PYQSA_SCHED_INPUTS_SYNC");
    const ggml_backend_buffer_t sbuf = buffer_of(src), dbuf = buffer_of(dst);
    return !off && backend->iface.set_tensor_async != nullptr && sbuf != nullptr && dbuf != nullptr &&
           src->data != nullptr && dst->data != nullptr && ggml_backend_buffer_is_host(sbuf) &&
           dbuf->buft == ggml_backend_get_default_buffer_type(backend) && ggml_is_contiguous(src) &&
           ggml_is_contiguous(dst) && ggml_nbytes(src) == ggml_nbytes(dst) && ggml_nbytes(src) <= MAX_TENSOR;
}

}  // namespace

bool pyqsa_input_stage_copy(pyqsa_input_stage ** stage, ggml_backend_t backend, const ggml_tensor * src, ggml_tensor * dst,
                            bool first) {
    if (!takes(backend, src, dst)) {
        return false;
    }
    pyqsa_input_stage * s = *stage;
    if (s == nullptr) {  // tried once: a refused allocation is not asked again at every input
        ggml_backend_dev_t         dev  = ggml_backend_get_device(backend);
        ggml_backend_buffer_type_t host = dev != nullptr ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
        ggml_backend_buffer_t      buf  = host != nullptr ? ggml_backend_buft_alloc_buffer(host, STAGE_BYTES) : nullptr;
        s = *stage = new pyqsa_input_stage{ buf, 0 };
    }
    if (s->buf == nullptr) {
        return false;
    }
    const size_t n = ggml_nbytes(src);
    // the stage's bytes are reused once the copies queued from them are done: at a split's first
    // input (the previous split's or pass's copies), or where it is full
    if (first || s->used + n > ggml_backend_buffer_get_size(s->buf)) {
        ggml_backend_synchronize(backend);
        s->used = 0;
    }
    auto * at = static_cast<char *>(ggml_backend_buffer_get_base(s->buf)) + s->used;
    std::memcpy(at, src->data, n);
    ggml_backend_tensor_set_async(backend, dst, at, 0, n);
    s->used += (n + ALIGN - 1) / ALIGN * ALIGN;
    return true;
}

void pyqsa_input_stage_free(pyqsa_input_stage * stage) {
    if (stage != nullptr) {
        ggml_backend_buffer_free(stage->buf);
        delete stage;
    }
}
