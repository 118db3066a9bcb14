// CPU kernel of PYQSA_GGML_OP_QSA_ATTN_PART: one (query, head) per work item, its whole list in
// one split (as qsa_attn's CPU kernel, whose steps it shares: qsa-attn.h); split 0 of the state.
#include "qsa-attn-part.h"

#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqsa-ggml.h"
#include "qsa-attn.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

void pyqsa_cpu_qsa_attn_part(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * q       = dst->src[0];  // [D, H, n_q, ns]
    const ggml_tensor * k       = dst->src[1];  // [D, Hkv, n_rows, ns]
    const ggml_tensor * v       = dst->src[2];
    const ggml_tensor * cells   = dst->src[3];  // [n_sel, n_q, ns] positions
    const int32_t *     n_paged = (const int32_t *) dst->src[4]->data;
    const ggml_tensor * state   = dst->src[5];  // [D + 2, H, n_q * ns, S] or null
    const float   scale   = ggml_get_op_params_f32(dst, 1);
    const int32_t r       = ggml_get_op_params_i32(dst, 2);
    const int32_t lo      = ggml_get_op_params_i32(dst, 3);
    const int32_t hi      = ggml_get_op_params_i32(dst, 4);
    const int32_t base    = ggml_get_op_params_i32(dst, 5);
    const int32_t ring    = ggml_get_op_params_i32(dst, 6);
    const bool    last    = ggml_get_op_params_i32(dst, 7) != 0;

    const int64_t D = q->ne[0], H = q->ne[1], n_q = q->ne[2], ns = q->ne[3];
    const int64_t group  = H / k->ne[1];
    const int64_t n_sel  = cells->ne[0];
    const int64_t n_rows = n_q * ns;
    // the state of (row, head) in split 0: acc[D], max, sum
    const auto    at     = [&](const float * t, int64_t row, int64_t h) { return t + (row * H + h) * (D + 2); };

    std::vector<float> krow(D), vrow(D), acc(D);
    for (int64_t item = params->ith; item < n_rows * H; item += params->nth) {
        const int64_t h   = item % H;
        const int64_t row = item / H;
        const int64_t iq  = row % n_q;
        const int64_t s   = row / n_q;
        const int64_t hk  = h / group;
        const int64_t stored = (int64_t) n_paged[row] * r;
        // the positions this pass takes, and the row each is at
        const int64_t c0 = ring > 0 ? std::max<int64_t>(lo, stored) : lo;
        const int64_t c1 = ring > 0 ? INT64_MAX : std::min<int64_t>(hi, stored);
        const auto    row_of = [&](int64_t c) { return ring > 0 ? base + c % ring : c - lo; };

        const float *   qrow = (const float *) ((const char *) q->data + h * q->nb[1] + iq * q->nb[2] + s * q->nb[3]);
        const int32_t * list = (const int32_t *) ((const char *) cells->data + iq * cells->nb[1] + s * cells->nb[2]);
        pyqsa_cpu_attn_state st;
        st.acc = acc.data();
        if (state != nullptr) {
            const float * in = at((const float *) state->data, row, h);
            std::copy(in, in + D, st.acc);
            st.m = in[D];
            st.l = in[D + 1];
        } else {
            std::fill(acc.begin(), acc.end(), 0.0f);
        }
        // the CUDA kernel's walk (qsa-attn-part.cu): a list is its block cells in increasing
        // order, -1 for blocks not visible, then the tail, past every stored position; so
        // "c < 0 or c >= c0" holds from some entry on when the pass takes any cell, and a stored
        // pass ends at its first entry past the window or at a -1
        const int64_t first = std::partition_point(list, list + n_sel, [&](int32_t c) { return c >= 0 && c < c0; }) - list;
        for (int64_t j = first; j < n_sel; ++j) {
            const int64_t c = list[j];
            if (ring == 0 && (c < 0 || c >= c1)) {
                break;
            }
            if (c < 0 || c < c0 || c >= c1) {
                continue;
            }
            const int64_t i = row_of(c);
            GGML_ASSERT(i >= 0 && i < k->ne[2]);
            pyqsa_cpu_attn_load_row(k, (const char *) k->data + i * k->nb[2] + s * k->nb[3] + hk * k->nb[1], krow.data(), D);
            pyqsa_cpu_attn_load_row(v, (const char *) v->data + i * v->nb[2] + s * v->nb[3] + hk * v->nb[1], vrow.data(), D);
            st.add(qrow, krow.data(), vrow.data(), D, scale);
        }

        if (!last) {
            float * out = (float *) at((const float *) dst->data, row, h);
            std::copy(acc.begin(), acc.end(), out);
            out[D]     = st.m;
            out[D + 1] = st.l;
            continue;
        }
        float * out = (float *) ((char *) dst->data + h * dst->nb[1] + iq * dst->nb[2] + s * dst->nb[3]);
        const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
        for (int64_t d = 0; d < D; ++d) {
            out[d] = acc[d] * inv;
        }
    }
}
