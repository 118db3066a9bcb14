// The counter-based uniforms of a seeded draw, shared by the host and CUDA samplers (and
// mirrored in numpy by pyqsa/engine/sampler.py): a draw's uniform for a token depends only on
// the request's seed, the draw's counter and the token id, so a request samples the same
// tokens in any batch, on any backend, without carrying a generator's state.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#    define PYQSA_HD __host__ __device__ __forceinline__
#else
#    define PYQSA_HD inline
#endif

// SplitMix64's finalizer: a bijection of 64-bit words that mixes every bit into every bit
PYQSA_HD uint64_t pyqsa_mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

PYQSA_HD uint64_t pyqsa_draw_key(uint64_t seed, uint32_t counter) {
    return pyqsa_mix64(seed + pyqsa_mix64((uint64_t) counter + 0x9E3779B97F4A7C15ull));
}

// in (0, 1): 53 random bits, centred in their interval, so log(-log(u)) is always finite
PYQSA_HD double pyqsa_draw_uniform(uint64_t key, int64_t id) {
    const uint64_t bits = pyqsa_mix64(key + (uint64_t) (id + 1) * 0x9E3779B97F4A7C15ull) >> 11;
    return ((double) bits + 0.5) * 0x1p-53;
}
