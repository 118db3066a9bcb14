// CUDA side of PYQSA_GGML_OP_QSA_PAGE_FETCH: a fork and join around bulk copies on a stream of
// their own. The fetch records an event on the compute stream (so the copy follows every node
// queued before it, the area's last reader among them), makes the copy stream wait for it,
// queues one host-to-device copy per (stream, K or V) of pinned memory there (the copy engine,
// at bulk PCIe speed), and records the area's own event; the wait makes the compute stream wait
// for that event. Kernels queued in between run while the copy engine moves the rows. The same
// calls are valid under CUDA graph capture: the copy stream joins the capture at the fork and
// leaves it at the join.
#include "qsa-page-fetch.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"

#include <map>
#include <mutex>
#include <utility>

namespace {

struct fetch_streams {
    cudaStream_t copy = nullptr;
    cudaEvent_t  fork = nullptr;
    std::map<const void *, cudaEvent_t> done;  // by area: the event its last fetch records
};

std::mutex mutex;

fetch_streams & streams_of(int device) {
    static std::map<int, fetch_streams> all;
    fetch_streams & f = all[device];
    if (f.copy == nullptr) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&f.copy, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&f.fork, cudaEventDisableTiming));
    }
    return f;
}

cudaEvent_t done_event(fetch_streams & f, const void * area) {
    cudaEvent_t & e = f.done[area];
    if (e == nullptr) {
        CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    return e;
}

}  // namespace

void pyqsa_cuda_qsa_page_fetch(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * area       = dst->src[0];
    const int64_t       n_rows     = area->ne[1];
    const int64_t       ns         = area->ne[2];
    const int64_t       store_rows = ggml_get_op_params_i32(dst, 1);
    const size_t        B          = area->nb[1];

    std::lock_guard<std::mutex> lock(mutex);
    fetch_streams & f = streams_of(ctx.device);
    CUDA_CHECK(cudaEventRecord(f.fork, ctx.stream()));
    CUDA_CHECK(cudaStreamWaitEvent(f.copy, f.fork, 0));
    for (int j = 0; j < 2; ++j) {
        char *       rows  = (char *) dst->src[j]->data;
        const char * store = (const char *) pyqsa_ggml_host_ptr(dst, 2 + 2 * j);
        for (int64_t s = 0; s < ns; ++s) {
            CUDA_CHECK(cudaMemcpyAsync(rows + s * area->nb[2], store + (size_t) s * store_rows * B, (size_t) n_rows * B,
                                       cudaMemcpyHostToDevice, f.copy));
        }
    }
    CUDA_CHECK(cudaEventRecord(done_event(f, area->data), f.copy));
}

void pyqsa_cuda_qsa_page_fetch_wait(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * fetch = dst->src[1];
    std::lock_guard<std::mutex> lock(mutex);
    fetch_streams & f = streams_of(ctx.device);
    CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), done_event(f, fetch->src[0]->data), 0));
}

bool pyqsa_cuda_qsa_page_fetch_supported(const ggml_tensor * op) {
    // an asynchronous copy needs pinned (or device) memory; from pageable memory it would run
    // synchronously, or not at all under graph capture
    return pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 2)) && pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 4));
}
