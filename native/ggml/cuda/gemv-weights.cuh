// The weights of pyqsa's gemv (gemv-f16.cu) by type: 8 weights of a row from element k (a
// multiple of 8) as 4 half2 (k, k + 1) .. (k + 6, k + 7) in a uint4, the form both kernels take
// (the one-column kernel sums them in f32, the 2-8 column one feeds them to m16n8k16 products).
// A quantized block is dequantized in registers, each weight rounded to f16 once from its
// quantized form (q exact in f16, the scales applied by one f16 product or fused multiply-add):
// ~2^-11 of a weight, where the block's own rounding is 2^-5 (q4) to 2^-8 (q8) of its range.
// Streaming loads (__ldcs): every weight is read once a step.
#pragma once

#include "ggml-cuda/common.cuh"

#include <type_traits>

template <ggml_type T> struct gemv_weights;

namespace pyqsa_gemv_detail {

__device__ __forceinline__ uint32_t ld16(const void * p) {
    return __ldcs((const unsigned short *) p);
}

// 8 bytes at a 2-byte aligned address, little-endian, as two words
__device__ __forceinline__ uint2 ld8_2(const uint8_t * p) {
    return make_uint2(ld16(p) | ld16(p + 2) << 16, ld16(p + 4) | ld16(p + 6) << 16);
}

// bytes 0, 1 (hi: 2, 3) of v, each an unsigned value u < 1024, as half2 (1024 + u0, 1024 + u1):
// 0x64 over each byte is the f16 of 1024 + the byte (1024's ulp is 1)
__device__ __forceinline__ half2 biased_pair(uint32_t v, bool hi) {
    const uint32_t h = __byte_perm(v, 0x64646464u, hi ? 0x4342 : 0x4140);
    return *(const half2 *) &h;
}

__device__ __forceinline__ uint32_t bits(half2 h) {
    return *(const uint32_t *) &h;
}

__device__ __forceinline__ half2 from_bits(uint32_t v) {
    return *(const half2 *) &v;
}

// an f16 scale's bits in both halves
__device__ __forceinline__ half2 splat(uint32_t h) {
    return from_bits(h | h << 16);
}

// the unsigned bytes u of q (8 weights' quants, q.x first) as (u - bias) * scale
__device__ __forceinline__ uint4 scaled(uint2 q, half2 bias, half2 scale) {
    const auto one = [&](uint32_t v, bool hi) { return bits(__hmul2(__hsub2(biased_pair(v, hi), bias), scale)); };
    return make_uint4(one(q.x, false), one(q.x, true), one(q.y, false), one(q.y, true));
}

// the unsigned bytes u of q as u * scale - min
__device__ __forceinline__ uint4 scaled_min(uint2 q, half2 scale, half2 min) {
    const half2 b   = __float2half2_rn(1024.0f);
    const auto  one = [&](uint32_t v, bool hi) {
        return bits(__hfma2(__hsub2(biased_pair(v, hi), b), scale, __hneg2(min)));
    };
    return make_uint4(one(q.x, false), one(q.x, true), one(q.y, false), one(q.y, true));
}

// the 4-bit fields of q's bytes from bit `shift` (0: low nibbles, 4: high)
__device__ __forceinline__ uint2 nibbles(uint2 q, int shift) {
    return make_uint2(q.x >> shift & 0x0F0F0F0Fu, q.y >> shift & 0x0F0F0F0Fu);
}

// bits o .. o + 3 of h (each 0 or 1) as bit 4 of bytes 0-3: the fifth bit of q5_0's and q5_1's quants
__device__ __forceinline__ uint32_t fifth_bits(uint32_t h, int o) {
    h >>= o;
    return ((h & 1) | (h & 2) << 7 | (h & 4) << 14 | (h & 8) << 21) << 4;
}

// q's bytes with the bits `mask` of h >> shift's bytes above their 4 (q5_K's fifth bit, q6_K's
// fifth and sixth)
__device__ __forceinline__ uint2 with_high_bits(uint2 q, uint2 h, int shift, uint32_t mask) {
    return make_uint2(q.x | (h.x >> shift & mask) << 4, q.y | (h.y >> shift & mask) << 4);
}

// q's bytes (the quants of weights o .. o + 7) with bits o .. o + 7 of h as their bit 4
__device__ __forceinline__ uint2 with_fifth_bits(uint2 q, uint32_t h, int o) {
    return make_uint2(q.x | fifth_bits(h, o), q.y | fifth_bits(h, o + 4));
}

// 8 bytes at a 4-byte aligned address
__device__ __forceinline__ uint2 ld8_4(const uint8_t * p) {
    return make_uint2(__ldcs((const unsigned int *) p), __ldcs((const unsigned int *) p + 1));
}

// q4_K's and q5_K's 6-bit scale and min of sub-block j (llama.cpp's get_scale_min_k4) from the
// block's first 16 bytes h (d and dmin, then the 12 bytes of scales) loaded at once: scales
// bytes j & 3 of h.y (0-3), h.z (4-7) and h.w (8-11)
__device__ __forceinline__ void scale_min_k4(uint4 h, int j, float & sc, float & m) {
    const int      at = 8 * (j & 3);
    const uint32_t a = h.y >> at, b = h.z >> at, c = h.w >> at;
    if (j < 4) {
        sc = (float) (a & 63);
        m  = (float) (b & 63);
    } else {
        sc = (float) ((c & 0xF) | (a >> 6 & 3) << 4);
        m  = (float) ((c >> 4 & 0xF) | (b >> 6 & 3) << 4);
    }
}

}  // namespace pyqsa_gemv_detail

template <> struct gemv_weights<GGML_TYPE_F16> {
    static constexpr int qk    = 8;   // weights of a block: K a multiple of it
    static constexpr int align = 16;  // the loads' alignment: of the data and of every row
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) k * sizeof(half); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        return __ldcs((const uint4 *) row + k / 8);
    }
};

// d * q, q int8: as unsigned bytes q + 128, so the bias is 1024 + 128
template <> struct gemv_weights<GGML_TYPE_Q8_0> {
    static constexpr int qk    = QK8_0;
    static constexpr int align = 2;
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK8_0) * sizeof(block_q8_0); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q8_0 * b = (const block_q8_0 *) row + k / QK8_0;
        const uint2        q = ld8_2((const uint8_t *) b->qs + k % QK8_0);
        return scaled(make_uint2(q.x ^ 0x80808080u, q.y ^ 0x80808080u), __float2half2_rn(1152.0f), splat(ld16(&b->d)));
    }
};

// the 32-weight blocks (llama.cpp's q4_0 .. q5_1): weights o = k % 32 .. + 7 are the low (o < 16)
// or high nibbles of qs[o % 16 ..], with q5's fifth bit o of qh; d (q - 8), d (q - 16) or d q + m
template <> struct gemv_weights<GGML_TYPE_Q4_0> {
    static constexpr int qk    = QK4_0;
    static constexpr int align = 2;  // 18-byte blocks
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK4_0) * sizeof(block_q4_0); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q4_0 * b = (const block_q4_0 *) row + k / QK4_0;
        const int          o = k % QK4_0;
        const uint2        q = nibbles(ld8_2(b->qs + o % 16), 4 * (o / 16));
        return scaled(q, __float2half2_rn(1024.0f + 8.0f), splat(ld16(&b->d)));
    }
};

template <> struct gemv_weights<GGML_TYPE_Q4_1> {
    static constexpr int qk    = QK4_1;
    static constexpr int align = 4;  // 20-byte blocks
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK4_1) * sizeof(block_q4_1); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q4_1 * b  = (const block_q4_1 *) row + k / QK4_1;
        const int          o  = k % QK4_1;
        const half2        dm = from_bits(__ldcs((const unsigned int *) b));
        const uint2        q  = nibbles(ld8_4(b->qs + o % 16), 4 * (o / 16));
        return scaled_min(q, __low2half2(dm), __hneg2(__high2half2(dm)));
    }
};

template <> struct gemv_weights<GGML_TYPE_Q5_0> {
    static constexpr int qk    = QK5_0;
    static constexpr int align = 2;  // 22-byte blocks
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK5_0) * sizeof(block_q5_0); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q5_0 * b = (const block_q5_0 *) row + k / QK5_0;
        const int          o = k % QK5_0;
        const uint32_t     h = ld16(b->qh) | ld16(b->qh + 2) << 16;
        const uint2        q = with_fifth_bits(nibbles(ld8_2(b->qs + o % 16), 4 * (o / 16)), h, o);
        return scaled(q, __float2half2_rn(1024.0f + 16.0f), splat(ld16(&b->d)));
    }
};

template <> struct gemv_weights<GGML_TYPE_Q5_1> {
    static constexpr int qk    = QK5_1;
    static constexpr int align = 8;  // 24-byte blocks, qs at 8
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK5_1) * sizeof(block_q5_1); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q5_1 * b  = (const block_q5_1 *) row + k / QK5_1;
        const int          o  = k % QK5_1;
        const half2        dm = from_bits(__ldcs((const unsigned int *) b));
        const uint32_t     h  = __ldcs((const unsigned int *) b->qh);
        const uint2        q4 = nibbles(__ldcs((const uint2 *) (b->qs + o % 16)), 4 * (o / 16));
        const uint2        q  = with_fifth_bits(q4, h, o);
        return scaled_min(q, __low2half2(dm), __hneg2(__high2half2(dm)));
    }
};

namespace pyqsa_gemv_detail {

// sub-block j's 8 weights of the quant bytes q (their nibbles j % 2, with q5_K's fifth bits
// already in bit 4) under the block header h
__device__ __forceinline__ uint4 k_sub_block(uint2 q, uint4 h, int j) {
    const float2 dm = __half22float2(from_bits(h.x));
    float        sc, m;
    scale_min_k4(h, j, sc, m);
    return scaled_min(q, __float2half2_rn(dm.x * sc), __float2half2_rn(dm.y * m));
}

}  // namespace pyqsa_gemv_detail

// sub-block j = (k % 256) / 32 of 32 weights: d * sc_j * q - dmin * m_j, q the low (j even) or
// high nibbles of qs[32 (j / 2) ..], 4 bits
// NOTE: the block's d, dmin and scales in one 16-byte load: a warp's load instruction reads a
// 32-byte sector of each of its 8 rows whatever it loads of them, so a byte a load was a sector
// for a byte; loaded apart (three byte loads and d's) they took 4 of a lane's 5 loads, and the
// products of 2-8 columns read 0.7-1.1 TB/s of weights (f16 ~2.5)
template <> struct gemv_weights<GGML_TYPE_Q4_K> {
    static constexpr int qk    = QK_K;
    static constexpr int align = 16;  // 144-byte blocks, qs at 16
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK_K) * sizeof(block_q4_K); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q4_K * b = (const block_q4_K *) row + k / QK_K;
        const int          j = k % QK_K / 32;
        const uint2        q = __ldcs((const uint2 *) (b->qs + 32 * (j / 2) + k % 32));
        return k_sub_block(nibbles(q, 4 * (j % 2)), __ldcs((const uint4 *) b), j);
    }
    // k in an even sub-block j: its weights k .. k + 7 and sub-block j + 1's k + 32 .. k + 39, the
    // other nibbles of the same bytes
    static __device__ __forceinline__ void load_step(const char * row, int k, uint4 (&v)[2]) {
        using namespace pyqsa_gemv_detail;
        const block_q4_K * b = (const block_q4_K *) row + k / QK_K;
        const int          j = k % QK_K / 32;
        const uint2        q = __ldcs((const uint2 *) (b->qs + 32 * (j / 2) + k % 32));
        const uint4        h = __ldcs((const uint4 *) b);
        v[0]                 = k_sub_block(nibbles(q, 0), h, j);
        v[1]                 = k_sub_block(nibbles(q, 4), h, j + 1);
    }
};

// as q4_K with a fifth bit: bit j of qh[k % 32 ..]
template <> struct gemv_weights<GGML_TYPE_Q5_K> {
    static constexpr int qk    = QK_K;
    static constexpr int align = 16;  // 176-byte blocks, qh at 16, qs at 48
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK_K) * sizeof(block_q5_K); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q5_K * b  = (const block_q5_K *) row + k / QK_K;
        const int          j  = k % QK_K / 32;
        const uint2        q  = __ldcs((const uint2 *) (b->qs + 32 * (j / 2) + k % 32));
        const uint2        qh = __ldcs((const uint2 *) (b->qh + k % 32));
        const uint2        q5 = with_high_bits(nibbles(q, 4 * (j % 2)), qh, j, 0x01010101u);
        return k_sub_block(q5, __ldcs((const uint4 *) b), j);
    }
    static __device__ __forceinline__ void load_step(const char * row, int k, uint4 (&v)[2]) {
        using namespace pyqsa_gemv_detail;
        const block_q5_K * b  = (const block_q5_K *) row + k / QK_K;
        const int          j  = k % QK_K / 32;
        const uint2        q  = __ldcs((const uint2 *) (b->qs + 32 * (j / 2) + k % 32));
        const uint2        qh = __ldcs((const uint2 *) (b->qh + k % 32));
        const uint4        h  = __ldcs((const uint4 *) b);
        v[0]                  = k_sub_block(with_high_bits(nibbles(q, 0), qh, j, 0x01010101u), h, j);
        v[1]                  = k_sub_block(with_high_bits(nibbles(q, 4), qh, j + 1, 0x01010101u), h, j + 1);
    }
};

// half n = (k % 256) / 128, quarter c of it, l = k % 32: d * sc * (q - 32), q 6 bits: the low
// (c < 2) or high nibbles of ql[64 n + 32 (c % 2) + l ..] and bits 2c, 2c + 1 of qh[32 n + l ..],
// sc = scales[8 n + l / 16 + 2 c]
template <> struct gemv_weights<GGML_TYPE_Q6_K> {
    static constexpr int qk    = QK_K;
    static constexpr int align = 2;  // 210-byte blocks
    static __device__ __forceinline__ size_t offset(int k) { return (size_t) (k / QK_K) * sizeof(block_q6_K); }
    static __device__ __forceinline__ uint4 load(const char * row, int k) {
        using namespace pyqsa_gemv_detail;
        const block_q6_K * b  = (const block_q6_K *) row + k / QK_K;
        const int          n  = k % QK_K / 128, c = k % 128 / 32, l = k % 32;
        const uint2        ql = ld8_2(b->ql + 64 * n + 32 * (c % 2) + l);
        const uint2        qh = ld8_2(b->qh + 32 * n + l);
        const float        d  = __half2float(__ushort_as_half((unsigned short) ld16(&b->d)));
        const half2        s  = __float2half2_rn(d * (float) b->scales[8 * n + l / 16 + 2 * c]);
        const uint2        q6 = with_high_bits(nibbles(ql, 4 * (c / 2)), qh, 2 * c, 0x03030303u);
        return scaled(q6, __float2half2_rn(1024.0f + 32.0f), s);
    }
    // k in quarter q = 0, or 0 or 2 (N = 2): the chunks k + 32 i of quarters q + i, i < N = 2 or 4,
    // whose quants are the nibbles of the same two 8-byte runs of ql and the bit pairs of one of qh
    template <int N> static __device__ __forceinline__ void load_step(const char * row, int k, uint4 (&v)[N]) {
        using namespace pyqsa_gemv_detail;
        static_assert(N == 2 || N == 4, "the quarters of one half");
        const block_q6_K * b     = (const block_q6_K *) row + k / QK_K;
        const int          n     = k % QK_K / 128, q = k % 128 / 32, l = k % 32;
        const uint2        ql[2] = { ld8_2(b->ql + 64 * n + l), ld8_2(b->ql + 64 * n + 32 + l) };
        const uint2        qh    = ld8_2(b->qh + 32 * n + l);
        const float        d     = __half2float(__ushort_as_half((unsigned short) ld16(&b->d)));
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int   c  = q + i;
            const half2 s  = __float2half2_rn(d * (float) b->scales[8 * n + l / 16 + 2 * c]);
            const uint2 q6 = with_high_bits(nibbles(ql[i % 2], 4 * (c / 2)), qh, 2 * c, 0x03030303u);  // q even
            v[i]           = scaled(q6, __float2half2_rn(1024.0f + 32.0f), s);
        }
    }
};

// the 8-weight chunks a lane-step of the gemv takes (gemv-f16.cu), 32 weights apart, where the
// type's loader has load_step (their loads those of one chunk, or nearly: q4_K's and q5_K's two
// sub-blocks share quant bytes and the block header, q6_K's four quarters quant bytes, d and the
// bit pairs of qh); 1: load alone
template <ggml_type T> struct gemv_step_chunks : std::integral_constant<int, 1> {};
template <> struct gemv_step_chunks<GGML_TYPE_Q4_K> : std::integral_constant<int, 2> {};
template <> struct gemv_step_chunks<GGML_TYPE_Q5_K> : std::integral_constant<int, 2> {};
template <> struct gemv_step_chunks<GGML_TYPE_Q6_K> : std::integral_constant<int, 4> {};

// calls f(std::integral_constant<ggml_type, T>) for a type of these weights and returns true, or
// returns false
template <typename F> bool pyqsa_with_gemv_weights(ggml_type type, F && f) {
    switch (type) {
        case GGML_TYPE_F16: f(std::integral_constant<ggml_type, GGML_TYPE_F16>{}); return true;
        case GGML_TYPE_Q4_0: f(std::integral_constant<ggml_type, GGML_TYPE_Q4_0>{}); return true;
        case GGML_TYPE_Q4_1: f(std::integral_constant<ggml_type, GGML_TYPE_Q4_1>{}); return true;
        case GGML_TYPE_Q5_0: f(std::integral_constant<ggml_type, GGML_TYPE_Q5_0>{}); return true;
        case GGML_TYPE_Q5_1: f(std::integral_constant<ggml_type, GGML_TYPE_Q5_1>{}); return true;
        case GGML_TYPE_Q8_0: f(std::integral_constant<ggml_type, GGML_TYPE_Q8_0>{}); return true;
        case GGML_TYPE_Q4_K: f(std::integral_constant<ggml_type, GGML_TYPE_Q4_K>{}); return true;
        case GGML_TYPE_Q5_K: f(std::integral_constant<ggml_type, GGML_TYPE_Q5_K>{}); return true;
        case GGML_TYPE_Q6_K: f(std::integral_constant<ggml_type, GGML_TYPE_Q6_K>{}); return true;
        default: return false;
    }
}

// a type's block as the gemv reads it: its weights (K a multiple of qk) and the alignment its loads
// need of the data and of every row; {0, 0} for a type it does not read
struct pyqsa_gemv_block {
    int qk, align;
};

inline pyqsa_gemv_block pyqsa_gemv_block_of(ggml_type type) {
    pyqsa_gemv_block b = { 0, 0 };
    pyqsa_with_gemv_weights(type, [&](auto t) {
        using weights = gemv_weights<decltype(t)::value>;
        b             = { weights::qk, weights::align };
    });
    return b;
}
