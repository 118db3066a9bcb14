// CPU kernel of PYQSA_GGML_OP_QSA_ATTN: the reference every other backend is checked against.
// One (query, head) per work item; online softmax over the listed cells, accumulated in f32.
#include "qsa-attn.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"

#include <cmath>
#include <vector>

void pyqsa_cpu_attn_load_row(const ggml_tensor * t, const char * row, float * out, int64_t D) {
    switch (t->type) {
        case GGML_TYPE_F32:
            std::copy((const float *) row, (const float *) row + D, out);
            break;
        case GGML_TYPE_F16:
            ggml_fp16_to_fp32_row((const ggml_fp16_t *) row, out, D);
            break;
        default:
            ggml_get_type_traits(t->type)->to_float(row, out, D);
            break;
    }
}

void pyqsa_cpu_attn_state::add(const float * qrow, const float * krow, const float * vrow, int64_t D, float scale) {
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
        dot += qrow[d] * krow[d];
    }
    const float score = dot * scale;
    const float m_new = std::max(m, score);
    const float old_w = std::exp(m - m_new);  // 0 on the first cell (m = -inf)
    const float new_w = std::exp(score - m_new);
    for (int64_t d = 0; d < D; ++d) {
        acc[d] = acc[d] * old_w + new_w * vrow[d];
    }
    l = l * old_w + new_w;
    m = m_new;
}

void pyqsa_cpu_qsa_attn(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];  // [D, H, n_q, ns]
    const ggml_tensor * k     = dst->src[1];  // [D, Hkv, n_kv, ns]
    const ggml_tensor * v     = dst->src[2];  // [D, Hkv, n_kv, ns]
    const ggml_tensor * cells = dst->src[3];  // [n_sel, n_q, ns]
    const float scale = ggml_get_op_params_f32(dst, 1);

    const int64_t D     = q->ne[0];
    const int64_t H     = q->ne[1];
    const int64_t n_q   = q->ne[2];
    const int64_t ns    = q->ne[3];
    const int64_t Hkv   = k->ne[1];
    const int64_t n_kv  = k->ne[2];
    const int64_t n_sel = cells->ne[0];
    const int64_t group = H / Hkv;

    std::vector<float> krow(D), vrow(D), acc(D);

    const int64_t n_items = ns * n_q * H;
    for (int64_t item = params->ith; item < n_items; item += params->nth) {
        const int64_t h  = item % H;
        const int64_t iq = (item / H) % n_q;
        const int64_t s  = item / (H * n_q);
        const int64_t hk = h / group;

        const float *   qrow = (const float *) ((const char *) q->data + h * q->nb[1] + iq * q->nb[2] + s * q->nb[3]);
        const int32_t * list = (const int32_t *) ((const char *) cells->data + iq * cells->nb[1] + s * cells->nb[2]);

        std::fill(acc.begin(), acc.end(), 0.0f);
        pyqsa_cpu_attn_state st;
        st.acc = acc.data();
        for (int64_t j = 0; j < n_sel; ++j) {
            const int32_t c = list[j];
            if (c < 0) {
                continue;
            }
            GGML_ASSERT(c < n_kv);
            pyqsa_cpu_attn_load_row(k, (const char *) k->data + c * k->nb[2] + s * k->nb[3] + hk * k->nb[1], krow.data(), D);
            pyqsa_cpu_attn_load_row(v, (const char *) v->data + c * v->nb[2] + s * v->nb[3] + hk * v->nb[1], vrow.data(), D);
            st.add(qrow, krow.data(), vrow.data(), D, scale);
        }

        float * out = (float *) ((char *) dst->data + h * dst->nb[1] + iq * dst->nb[2] + s * dst->nb[3]);
        const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
        for (int64_t d = 0; d < D; ++d) {
            out[d] = acc[d] * inv;
        }
    }
}
