// CPU kernel of PYQSA_GGML_OP_QSA_SCORE: each thread takes a contiguous run of (stream, block)
// keys, so a decode step with one stream still spreads over every thread, and a prefill chunk's
// many queries are walked in tiles over those keys. Heads are summed in order 0..n_head-1 after
// the ReLU, then scaled, as the reference does.
#include "qsa-score.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/vec.h"
#include "ggml-impl.h"

#include <algorithm>

namespace {

constexpr int LANES = 16;
constexpr int64_t TILE_TPS = 16;

// q . key for short rows (the small test models' indexers): ggml_vec_dot_f32 runs scalar code
// below its SIMD step (64 floats on AVX-512), while LANES independent partial sums vectorize at
// any length. A fixed pairwise reduction keeps the order the same on every call.
float dot_short(const float * q, const float * key, int64_t D) {
    float part[LANES] = {};
    int64_t d = 0;
    for (; d + LANES <= D; d += LANES) {
        for (int j = 0; j < LANES; ++j) {
            part[j] += q[d + j] * key[d + j];
        }
    }
    for (int j = 0; d < D; ++d, ++j) {
        part[j] += q[d] * key[d];
    }
    for (int w = LANES / 2; w > 0; w /= 2) {
        for (int j = 0; j < w; ++j) {
            part[j] += part[j + w];
        }
    }
    return part[0];
}

float dot(const float * q, const float * key, int64_t D) {
    if (D < 64) {
        return dot_short(q, key, D);
    }
    float s = 0.0f;
    ggml_vec_dot_f32((int) D, &s, 0, q, 0, key, 0, 1);
    return s;
}

}  // namespace

void pyqsa_cpu_qsa_score(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];  // [D, n_head, n_tps, ns]
    const ggml_tensor * keys = dst->src[1];  // [D, n_blocks, ns]
    const float scale = ggml_get_op_params_f32(dst, 1);

    const int64_t D        = q->ne[0];
    const int64_t n_head   = q->ne[1];
    const int64_t n_tps    = q->ne[2];
    const int64_t n_blocks = keys->ne[1];
    const int64_t n_items  = n_blocks * keys->ne[2];

    const int64_t per_thread = (n_items + params->nth - 1) / params->nth;
    const int64_t first      = per_thread * params->ith;
    const int64_t last       = std::min(n_items, first + per_thread);
    // queries in tiles of TILE_TPS, so a prefill chunk's rows stay in cache across the thread's
    // keys (each score's arithmetic is the same in any loop order)
    for (int64_t t0 = 0; t0 < n_tps; t0 += TILE_TPS) {
        const int64_t t1 = std::min(n_tps, t0 + TILE_TPS);
        for (int64_t item = first; item < last; ++item) {
            const int64_t b = item % n_blocks;
            const int64_t s = item / n_blocks;
            const float * key = (const float *) ((const char *) keys->data + b * keys->nb[1] + s * keys->nb[2]);
            for (int64_t t = t0; t < t1; ++t) {
                float acc = 0.0f;
                for (int64_t h = 0; h < n_head; ++h) {
                    const float * qrow =
                        (const float *) ((const char *) q->data + h * q->nb[1] + t * q->nb[2] + s * q->nb[3]);
                    acc += std::max(dot(qrow, key, D), 0.0f);
                }
                float * out = (float *) ((char *) dst->data + t * dst->nb[1] + s * dst->nb[2]);
                out[b] = acc * scale;
            }
        }
    }
}
