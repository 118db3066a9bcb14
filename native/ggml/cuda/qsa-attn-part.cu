// CUDA kernel of PYQSA_GGML_OP_QSA_ATTN_PART: qsa_attn's CTA per (GQA group, query, split), each
// head's warp resumed from the previous pass's state and stopped after this pass's cells. The CTA
// reads the part of its list this pass can take 32 entries at a time and takes the entries in the
// pass's positions in list order, so the cells reach each head's online softmax in the order
// qsa_attn's kernel adds them.
#include "qsa-attn-part.cuh"

#include "pyqsa-ggml.h"
#include "qsa-attn-warp.cuh"

#include <climits>

using namespace pyqsa_attn;

namespace {

struct pass {
    const float *   state;    // [n_split, n_rows, H, D + 2] or null (the first pass)
    float *         next;     // the next state, or null (the last pass)
    const int32_t * n_paged;  // [n_rows]
    int r, lo, hi, base, ring;
};

// grid (H / nw, n_q * ns, n_split), nw warps: one per head of a GQA group
template <ggml_type type, int DPL>
__global__ void qsa_attn_part_kernel(const args a, const pass p) {
    extern __shared__ __align__(16) char smem[];
    constexpr int D     = DPL * WARP;
    const int     row   = blockIdx.y;
    const int     split = blockIdx.z;

    cta_attn<DPL> t(a, row, smem);
    const int     h = t.head(a);
    if (p.state != nullptr) {
        const float * st = state_at<DPL>(p.state, a, h, row, split);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            t.w.acc[i] = st[i * WARP + t.lane];
        }
        t.w.m = st[D];
        t.w.l = st[D + 1];
    }
    // the positions this pass takes
    const long long stored = (long long) p.n_paged[row] * p.r;
    const long long c0     = p.ring > 0 ? max((long long) p.lo, stored) : p.lo;
    const long long c1     = p.ring > 0 ? LLONG_MAX : min((long long) p.hi, stored);

    const int32_t * list = a.cells + (size_t) row * a.n_sel;
    int             j0, j1;
    split_range(a, split, j0, j1);
    // A list is its block cells in increasing order, -1 for blocks not visible, then the tail,
    // which lies past every stored position: "c < 0 or c >= c0" holds from some entry on
    // whenever this pass takes any cell, so a binary search finds where to start, and a stored
    // pass stops at its first entry past the window (or at a -1).
    int first = j0;
    for (int end = j1; first < end;) {
        const int mid = (first + end) / 2;
        const int c   = list[mid];
        if (c >= 0 && c < c0) {
            first = mid + 1;
        } else {
            end = mid;
        }
    }
    for (int jb = first; jb < j1; jb += WARP) {
        const int  c  = jb + t.lane < j1 ? list[jb + t.lane] : -1;
        const bool in = c >= 0 && c >= c0 && c < c1;
        t.template add_rows<type>(a, in, !in ? 0 : p.ring > 0 ? p.base + c % p.ring : c - p.lo);
        if (p.ring == 0 && __any_sync(0xffffffffu, c < 0 || c >= c1)) {
            break;
        }
    }
    if (p.next != nullptr) {
        store_state<DPL>(state_at<DPL>(p.next, a, h, row, split), t.w.acc, t.w.m, t.w.l, t.lane);
    } else {
        write_partial<DPL>(a, t.w.acc, t.w.m, t.w.l, h, row, split, t.lane);
    }
}

}  // namespace

bool pyqsa_cuda_qsa_attn_part_supported(const ggml_tensor * op) {
    return supported(op);
}

void pyqsa_cuda_qsa_attn_part(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];  // [D, H, n_q, ns]
    const ggml_tensor * k     = dst->src[1];  // [D, Hkv, n_rows, ns]
    const ggml_tensor * state = dst->src[5];  // [D + 2, H, n_q * ns, n_split] or null
    const bool          last  = ggml_get_op_params_i32(dst, 7) != 0;

    const int n_rows = (int) (q->ne[2] * q->ne[3]);
    args      a      = make_args(q, k, dst->src[2], dst->src[3], dst, ggml_get_op_params_f32(dst, 1));
    a.n_split        = pyqsa_ggml_qsa_attn_cuda_splits(a.n_sel, n_rows, a.H);  // qsa_attn's
    pass p;
    p.state   = state ? (const float *) state->data : nullptr;
    p.next    = last ? nullptr : (float *) dst->data;
    p.n_paged = (const int32_t *) dst->src[4]->data;
    p.r       = ggml_get_op_params_i32(dst, 2);
    p.lo      = ggml_get_op_params_i32(dst, 3);
    p.hi      = ggml_get_op_params_i32(dst, 4);
    p.base    = ggml_get_op_params_i32(dst, 5);
    p.ring    = ggml_get_op_params_i32(dst, 6);

    cudaStream_t stream = ctx.stream();
    by_kv_type(k->type, [&](auto type) {
        by_head_dim((int) q->ne[0], [&](auto dpl) {
            constexpr int DPL    = decltype(dpl)::value;
            const auto    launch = [&](const args & pa) {
                qsa_attn_part_kernel<decltype(type)::value, DPL>
                    <<<dim3(a.H / a.nw, n_rows, a.n_split), a.nw * WARP, stage_bytes(a), stream>>>(pa, p);
                CUDA_CHECK(cudaGetLastError());
            };
            if (last) {
                run_split<DPL>(ctx, a, n_rows, launch);
            } else {
                launch(a);
            }
        });
    });
}
