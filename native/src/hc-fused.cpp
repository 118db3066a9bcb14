// pyqsa: the switches of qwen4exp's fused hyper-connection ops (see hc-fused.h).
#include "hc-fused.h"

#include <cstdlib>
#include <cstring>

bool pyqsa_hc_fused() {
    static const bool fused = [] {
        const char * v = std::getenv("PYQSA_HC_UNFUSED");
        return v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0;
    }();
    return fused;
}
