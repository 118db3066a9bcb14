// CUDA kernel of PYQSA_GGML_OP_QSA_ATTN, flash-decoding style: the cell list of every
// (query, head) is split across CTAs (split-K); each warp keeps an online softmax over its share
// and a second kernel merges the partial (max, sum, acc) triples (qsa-attn-warp.cuh).
// One CTA per (GQA group, query, split), one warp a head: the group's heads read each cell's K/V
// rows once, from shared memory (cta_attn). Calls with f16 K/V go to the tensor-core kernel
// instead (qsa-attn-mma.cu) unless PYQSA_QSA_ATTN_MMA=0.
#include "qsa-attn.cuh"

#include "pyqsa-ggml.h"
#include "qsa-attn-mma.cuh"
#include "qsa-attn-warp.cuh"

using namespace pyqsa_attn;

namespace {

// grid (H / nw, n_q * ns, n_split), nw warps: one per head of a GQA group
template <ggml_type type, int DPL>
__global__ void qsa_attn_partial(const args a) {
    extern __shared__ __align__(16) char smem[];
    const int row   = blockIdx.y;
    const int split = blockIdx.z;

    cta_attn<DPL>   t(a, row, smem);
    const int32_t * list = a.cells + (size_t) row * a.n_sel;
    int             j0, j1;
    split_range(a, split, j0, j1);
    for (int jb = j0; jb < j1; jb += WARP) {
        const int c = jb + t.lane < j1 ? list[jb + t.lane] : -1;
        t.template add_rows<type>(a, c >= 0, c);
    }
    write_partial<DPL>(a, t.w.acc, t.w.m, t.w.l, t.head(a), row, split, t.lane);
}

}  // namespace

bool pyqsa_cuda_qsa_attn_supported(const ggml_tensor * op) {
    return supported(op);
}

void pyqsa_cuda_qsa_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];  // [D, H, n_q, ns]
    const ggml_tensor * k     = dst->src[1];  // [D, Hkv, n_kv, ns]
    const ggml_tensor * cells = dst->src[3];  // [n_sel, n_q, ns]

    args a = make_args(q, k, dst->src[2], cells, dst, ggml_get_op_params_f32(dst, 1));
    const int n_rows = (int) (q->ne[2] * q->ne[3]);
    // enough CTAs to fill the GPU at decode, none wasted when many queries already do
    a.n_split = pyqsa_ggml_qsa_attn_cuda_splits(a.n_sel, n_rows, a.H);
    if (pyqsa_cuda_qsa_attn_mma(ctx, a, k->type, (int) q->ne[0], n_rows)) {
        return;
    }

    cudaStream_t stream = ctx.stream();
    by_kv_type(k->type, [&](auto type) {
        by_head_dim((int) q->ne[0], [&](auto dpl) {
            constexpr int DPL = decltype(dpl)::value;
            run_split<DPL>(ctx, a, n_rows, [&](const args & pa) {
                qsa_attn_partial<decltype(type)::value, DPL>
                    <<<dim3(a.H / a.nw, n_rows, a.n_split), a.nw * WARP, stage_bytes(a), stream>>>(pa);
                CUDA_CHECK(cudaGetLastError());
            });
        });
    });
}
