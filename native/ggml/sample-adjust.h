// A row's logit adjustments (pyqsa_logit_adjust, pyqsa.h), shared by the host and CUDA kernels
// of the sample op: the same float32 steps in the same order as the numpy reference.
#pragma once

#include "pyqsa.h"
#include "sample-rng.h"

PYQSA_HD float pyqsa_adjusted_logit(float x, const pyqsa_logit_adjust & a) {
#ifdef __CUDA_ARCH__
    // ggml builds CUDA code with -use_fast_math (approximate division, fused multiply-adds):
    // the _rn intrinsics keep each step an IEEE float32 operation, as on the host
    x = __fadd_rn(x, a.bias);
    if (a.rep != 1.0f) {
        x = x > 0.0f ? __fdiv_rn(x, a.rep) : __fmul_rn(x, a.rep);
    }
    return __fsub_rn(x, a.sub);
#else
    x += a.bias;
    if (a.rep != 1.0f) {
        x = x > 0.0f ? x / a.rep : x * a.rep;
    }
    return x - a.sub;
#endif
}
