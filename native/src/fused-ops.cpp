// pyqsa: the switches of qwen4exp's fused ops (see fused-ops.h).
#include "fused-ops.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-memory-recurrent.h"
#include "pyqsa-env.h"
#include "pyqsa-ggml.h"

#include <cstdlib>

bool pyqsa_hc_fused() {
    static const bool fused = !pyqsa_env_switch_on("PYQSA_HC_UNFUSED");
    return fused;
}

ggml_tensor * pyqsa_hc_combine(ggml_context * ctx, ggml_tensor * block_out, ggml_tensor * residual,
                               ggml_tensor * inject, float scale) {
    static const bool join = !pyqsa_env_switch_on("PYQSA_HC_JOIN_UNFUSED");
    if (join && block_out->op == GGML_OP_PYQSA &&
        block_out->op_params[0] == PYQSA_GGML_OP_ADD_GATED) {  // the sub-op (pyqsa-ggml.h)
        return pyqsa_ggml_hc_combine_gated(ctx, block_out->src[0], block_out->src[1], block_out->src[2], residual,
                                           inject, scale);
    }
    return pyqsa_ggml_hc_combine(ctx, block_out, residual, inject, scale);
}

// whether device dev runs the mix's two ops for these tensors: the ops built aside and asked
static bool device_runs_mix(ggml_backend_dev_t dev, ggml_tensor * x, ggml_tensor * w_norm, ggml_tensor * w_down,
                            ggml_tensor * w_up, ggml_tensor * w_inject) {
    const ggml_init_params params = { 2 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *         ctx    = ggml_init(params);
    ggml_tensor *          down   = pyqsa_ggml_hc_down(ctx, x, w_norm, w_down, w_inject, 0.0f, 1.0f);
    ggml_tensor *          pre    = pyqsa_ggml_hc_pre(ctx, x, w_norm, w_up, down, 1.0f);
    const bool             runs   = ggml_backend_dev_supports_op(dev, down) && ggml_backend_dev_supports_op(dev, pre);
    ggml_free(ctx);
    return runs;
}

bool pyqsa_hc_mix_fused(ggml_tensor * x, ggml_tensor * w_norm, ggml_tensor * w_down, ggml_tensor * w_up,
                        ggml_tensor * w_inject) {
    static const bool fused       = !pyqsa_env_switch_on("PYQSA_HC_MIX_UNFUSED");
    static const bool any_backend = pyqsa_env_switch_on("PYQSA_HC_MIX_ANY_BACKEND");
    ggml_backend_dev_t dev =
        w_down->buffer ? ggml_backend_buft_get_device(ggml_backend_buffer_get_type(w_down->buffer)) : nullptr;
    const bool on_gpu = dev != nullptr && ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU;
    if (dev == nullptr) {  // host memory of no device (a mapped file's): the CPU's
        dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    }
    // NOTE: one token. On an H100 the two ops took an 8 x 32K step's mixes at par with upstream's
    // (test-fused perf at 8 tokens: 30.0 us against 30.4), a 1 x 32K step's 1.03 ms faster (5.54
    // ms against 6.57, decode.py, 3 runs each). PYQSA_HC_MIX_TOKENS=N fuses up to N (to measure).
    static const int max_tokens = [] {
        const char * v = std::getenv("PYQSA_HC_MIX_TOKENS");
        return v != nullptr && *v != '\0' ? std::atoi(v) : 1;
    }();
    const bool tokens = x->ne[2] <= max_tokens;
    // what the ops' builders take
    const bool types  = x->type == GGML_TYPE_F32 && w_norm->type == GGML_TYPE_F32 &&
                       pyqsa_hc_weight_type(w_down->type) && pyqsa_hc_weight_type(w_up->type) &&
                       w_inject->type == w_down->type;
    const bool layout = ggml_is_contiguous(x) && ggml_is_contiguous(w_norm) && ggml_is_contiguous(w_down) &&
                        ggml_is_contiguous(w_up) && ggml_is_contiguous(w_inject);
    return fused && (on_gpu || any_backend) && tokens && types && layout && dev != nullptr &&
           device_runs_mix(dev, x, w_norm, w_down, w_up, w_inject);
}

bool pyqsa_gates_fused() {
    static const bool fused = !pyqsa_env_switch_on("PYQSA_GATES_UNFUSED");
    return fused;
}

bool pyqsa_rs_in_place(const llama_memory_recurrent_context * mctx, uint32_t n_seqs, uint32_t n_rs_seq) {
    // s_copy reads (and resets) rollback indices with rollback slots: never ask it then
    if (!pyqsa_gates_fused() || n_rs_seq > 0 || mctx->get_rs_z() >= 0 || mctx->get_n_rs() != n_seqs) {
        return false;
    }
    for (uint32_t i = 0; i < n_seqs; ++i) {
        if (mctx->s_copy((int) i) != (int32_t) (mctx->get_head() + i)) {
            return false;
        }
    }
    return true;
}
