// pyqsa: the switches of qwen4exp's fused ops (see fused-ops.h).
#include "fused-ops.h"

#include "llama-memory-recurrent.h"
#include "pyqsa-env.h"

bool pyqsa_hc_fused() {
    static const bool fused = !pyqsa_env_switch_on("PYQSA_HC_UNFUSED");
    return fused;
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
