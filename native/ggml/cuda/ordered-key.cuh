// Order-preserving unsigned keys of floats, for radix selects over scores and logits.
#pragma once

#include <cstdint>

// larger float -> larger unsigned key; -inf is the smallest finite-order key
__device__ __forceinline__ uint32_t ordered_key(float x) {
    const uint32_t bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
