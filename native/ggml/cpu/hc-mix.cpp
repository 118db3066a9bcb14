// CPU kernels of the hyper-connection mix. HC_DOWN: each thread normalizes its share of the
// (stream, token) rows into the work buffer as ggml_rms_norm and ggml_mul round them, then,
// after a barrier, takes its share of the weight rows, each against every token. HC_PRE: each
// thread takes its share of the embedding positions, each position's hc rows of w_up against
// every token's low-rank input, and recomputes xn from the factors HC_DOWN left.
#include "hc-mix.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/vec.h"
#include "ggml-impl.h"

#include <cmath>
#include <vector>

namespace {

// row r of a contiguous weight (F32, F16 or quantized) as f32 in buf
const float * weight_row(const ggml_tensor * w, int64_t r, std::vector<float> & buf) {
    const int64_t n   = w->ne[0];
    const char *  row = (const char *) w->data + r * w->nb[1];
    if (w->type == GGML_TYPE_F32) {
        return (const float *) row;
    }
    buf.resize(n);
    ggml_get_type_traits(w->type)->to_float(row, buf.data(), n);
    return buf.data();
}

float dot(const float * a, const float * b, int64_t n) {
    float s = 0.0f;
    ggml_vec_dot_f32((int) n, &s, 0, a, 0, b, 0, 1);
    return s;
}

}  // namespace

size_t pyqsa_cpu_hc_down_work_size(const struct ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    return (size_t) ggml_nelements(x) * sizeof(float);  // xn, [hc n_embd, n_tokens]
}

void pyqsa_cpu_hc_down(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x        = dst->src[0];  // [n_embd, hc, n_tokens]
    const ggml_tensor * w_norm   = dst->src[1];  // [n_embd, hc]
    const ggml_tensor * w_down   = dst->src[2];  // [hc n_embd, lr]
    const ggml_tensor * w_inject = dst->src[3];  // [hc n_embd, hc]
    const float         eps      = ggml_get_op_params_f32(dst, 1);
    const float         scale    = ggml_get_op_params_f32(dst, 2);
    const int64_t       n_embd = x->ne[0], hc = x->ne[1], n_tokens = x->ne[2], lr = w_down->ne[1];
    const int64_t       width  = n_embd * hc;
    float *             xn     = (float *) params->wdata;

    for (int64_t row = params->ith; row < hc * n_tokens; row += params->nth) {
        const int64_t c = row % hc, t = row / hc;
        const float * xr = (const float *) x->data + row * n_embd;
        const float * g  = (const float *) w_norm->data + c * n_embd;
        ggml_float    ss = 0.0;  // as ggml_rms_norm sums
        for (int64_t e = 0; e < n_embd; ++e) {
            ss += (ggml_float) (xr[e] * xr[e]);
        }
        const float mean = (float) (ss / n_embd);
        const float f    = 1.0f / sqrtf(mean + eps);
        float *     out  = xn + row * n_embd;
        for (int64_t e = 0; e < n_embd; ++e) {
            out[e] = (xr[e] * f) * g[e];
        }
        ((float *) dst->data)[(lr + hc) * n_tokens + row] = f;  // factor [hc, n_tokens]
    }
    ggml_barrier(params->threadpool);

    std::vector<float> buf;
    for (int64_t r = params->ith; r < lr + hc; r += params->nth) {
        const float * w = r < lr ? weight_row(w_down, r, buf) : weight_row(w_inject, r - lr, buf);
        for (int64_t t = 0; t < n_tokens; ++t) {
            const float s = dot(w, xn + t * width, width);
            float *     d = (float *) dst->data;
            if (r < lr) {
                d[t * lr + r] = ggml_silu_f32(scale * s);  // lo [lr, n_tokens]
            } else {
                d[lr * n_tokens + t * hc + (r - lr)] = s;  // inject [hc, n_tokens]
            }
        }
    }
}

void pyqsa_cpu_hc_pre(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * x      = dst->src[0];  // [n_embd, hc, n_tokens]
    const ggml_tensor * w_norm = dst->src[1];  // [n_embd, hc]
    const ggml_tensor * w_up   = dst->src[2];  // [lr, hc n_embd]
    const float *       down   = (const float *) dst->src[3]->data;  // lo, inject, factor
    const float         scale  = ggml_get_op_params_f32(dst, 1);
    const int64_t       n_embd = x->ne[0], hc = x->ne[1], n_tokens = x->ne[2], lr = w_up->ne[0];

    std::vector<float> buf;
    std::vector<float> sum(n_tokens);
    for (int64_t e = params->ith; e < n_embd; e += params->nth) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t c = 0; c < hc; ++c) {
            const float * w = weight_row(w_up, e + c * n_embd, buf);
            const float   g = ((const float *) w_norm->data)[e + c * n_embd];
            for (int64_t t = 0; t < n_tokens; ++t) {
                const float gate   = dot(w, down + t * lr, lr);
                const float factor = down[(lr + hc) * n_tokens + t * hc + c];
                const float xn     = (((const float *) x->data)[(t * hc + c) * n_embd + e] * factor) * g;
                sum[t] += xn * (1.0f / (1.0f + expf(-gate)));  // dsv4_hc_pre's sum
            }
        }
        for (int64_t t = 0; t < n_tokens; ++t) {
            ((float *) ((char *) dst->data + t * dst->nb[1]))[e] = scale * sum[t];
        }
    }
}
