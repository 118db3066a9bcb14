// CUDA kernel of PYQSA_GGML_OP_HC_COMBINE: a thread an output element, as upstream's
// dsv4_hc_post, each computing its stream's weight (an expf beside n_embd loads per row); in the
// gated form the block's output element as add_gated's kernel computes it.
#include "hc-combine.cuh"

#include "add-gated.cuh"

namespace {

struct hc_combine_args {
    const float * x;         // [n_embd, n_tokens]: the block's output, or the join's base
    const float * residual;  // [n_embd, hc, n_tokens]
    const float * inject;    // [hc, n_tokens]
    const float * joined;    // [n_embd, n_tokens]: the join's x (nullptr: none)
    const float * gate;      // [1, n_tokens]: the join's g
    float *       dst;       // [n_embd, hc, n_tokens], contiguous
    float         scale;
    int64_t       n_embd, hc, n;
    int64_t       sx1, sr1, sr2, si0, si1, sj1, sg1;  // strides in floats
};

__global__ void hc_combine(const hc_combine_args a) {
    ggml_cuda_pdl_lc();
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) {
        return;
    }
    ggml_cuda_pdl_sync();
    const int64_t e = i % a.n_embd;
    const int64_t c = (i / a.n_embd) % a.hc;
    const int64_t t = i / (a.n_embd * a.hc);
    const float o   = a.joined ? add_gated_element(a.x[e + t * a.sx1], a.joined[e + t * a.sj1], a.gate[t * a.sg1]) :
                                 a.x[e + t * a.sx1];
    const float sum = hc_combine_element(o, a.residual[e + c * a.sr1 + t * a.sr2], a.inject[c * a.si0 + t * a.si1],
                                         a.scale);
    a.dst[i] = sum;
}

}  // namespace

void pyqsa_cuda_hc_combine(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x        = dst->src[0];
    const ggml_tensor * residual = dst->src[1];
    const ggml_tensor * inject   = dst->src[2];
    const ggml_tensor * joined   = dst->src[3];
    const ggml_tensor * gate     = dst->src[4];
    GGML_ASSERT(ggml_is_contiguous(dst));
    const int64_t         n = ggml_nelements(dst);
    const hc_combine_args a = {
        (const float *) x->data,
        (const float *) residual->data,
        (const float *) inject->data,
        joined ? (const float *) joined->data : nullptr,
        gate ? (const float *) gate->data : nullptr,
        (float *) dst->data,
        ggml_get_op_params_f32(dst, 1),
        dst->ne[0],
        dst->ne[1],
        n,
        (int64_t) (x->nb[1] / sizeof(float)),
        (int64_t) (residual->nb[1] / sizeof(float)),
        (int64_t) (residual->nb[2] / sizeof(float)),
        (int64_t) (inject->nb[0] / sizeof(float)),
        (int64_t) (inject->nb[1] / sizeof(float)),
        joined ? (int64_t) (joined->nb[1] / sizeof(float)) : 0,
        gate ? (int64_t) (gate->nb[1] / sizeof(float)) : 0,
    };
    constexpr int block = 256;
    const ggml_cuda_kernel_launch_params launch((unsigned) ((n + block - 1) / block), block, 0, ctx.stream());
    ggml_cuda_kernel_launch(hc_combine, launch, a);
}
