// pyqsa: the switches of qwen4exp's fused ops (see fused-ops.h).
#include "fused-ops.h"

#include <cstdlib>
#include <cstring>

static bool unset(const char * name) {
    const char * v = std::getenv(name);
    return v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0;
}

bool pyqsa_hc_fused() {
    static const bool fused = unset("PYQSA_HC_UNFUSED");
    return fused;
}

bool pyqsa_gates_fused() {
    static const bool fused = unset("PYQSA_GATES_UNFUSED");
    return fused;
}
