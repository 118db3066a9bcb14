// pyqsa: the switches of qwen4exp's fused ops (see fused-ops.h).
#include "fused-ops.h"

#include "pyqsa-env.h"

bool pyqsa_hc_fused() {
    static const bool fused = !pyqsa_env_switch_on("PYQSA_HC_UNFUSED");
    return fused;
}

bool pyqsa_gates_fused() {
    static const bool fused = !pyqsa_env_switch_on("PYQSA_GATES_UNFUSED");
    return fused;
}
