// Per-thread error of pyqsa's code inside llama_decode (see pyqsa-error.h).
#include "pyqsa-error.h"

#include "pyqsa.h"

#include <cstdarg>
#include <cstdio>
#include <string>

namespace {

thread_local std::string last_error;

}  // namespace

void pyqsa_error_set(const char * fmt, ...) {
    if (!last_error.empty()) {
        return;
    }
    char    buf[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, args);
    va_end(args);
    last_error = buf;
}

int32_t pyqsa_last_error(char * buf, size_t cap) {
    if (last_error.empty()) {
        return 0;
    }
    if (buf == nullptr || cap == 0) {
        return PYQSA_ERR_INVALID_ARG;
    }
    std::snprintf(buf, cap, "%s", last_error.c_str());
    const int32_t n = (int32_t) last_error.size();
    last_error.clear();
    return n;
}
