// A row's logit adjustments (pyqsa_logit_adjust, pyqsa.h), shared by the host and CUDA kernels
// of the sample op: the same float32 steps in the same order as the numpy reference.
#pragma once

#include "pyqsa.h"
#include "sample-rng.h"

PYQSA_HD float pyqsa_adjusted_logit(float x, const pyqsa_logit_adjust & a) {
    x += a.bias;
    if (a.rep != 1.0f) {
        x = x > 0.0f ? x / a.rep : x * a.rep;
    }
    return x - a.sub;
}
