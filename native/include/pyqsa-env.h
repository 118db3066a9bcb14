// pyqsa's switch variables (PYQSA_HC_UNFUSED, PYQSA_CUDA_STRICT_F32, ...), read one way in every
// library: a switch is on when its variable is set to anything but "" or "0".
#pragma once

#include <cstdlib>
#include <cstring>

inline bool pyqsa_env_switch_on(const char * name) {
    const char * v = std::getenv(name);
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}
