// The parameters a sample kernel acts on, shared by the host and CUDA kernels: out-of-range
// values mean "off" (greedy for the temperature), so a row whose parameters nobody set (llama.cpp
// runs an inactive sequence's sampler on a dummy row) costs little and reads nothing out of
// bounds. The engine only sends values its request checks accepted.
#pragma once

#include "pyqsa.h"
#include "sample-rng.h"

PYQSA_HD pyqsa_sample_params pyqsa_sample_params_checked(pyqsa_sample_params p, int64_t n_vocab) {
    // NaN fails every comparison below, so it turns the setting off too
    if (!(p.temperature >= 1e-3f && p.temperature <= 1e30f)) {
        p.temperature = 0.0f;
    }
    if (!(p.top_k > 0 && p.top_k < n_vocab)) {
        p.top_k = 0;
    }
    if (!(p.top_p > 0.0f && p.top_p < 1.0f)) {
        p.top_p = 1.0f;
    }
    if (!(p.min_p > 0.0f && p.min_p <= 1.0f)) {
        p.min_p = 0.0f;
    }
    if (p.n_top < -1 || p.n_top > 20) {
        p.n_top = -1;
    }
    return p;
}
