// CUDA kernel of PYQSA_GGML_OP_HC_COMBINE: a thread an output element, as upstream's
// dsv4_hc_post, each computing its stream's weight (an expf beside n_embd loads per row); in the
// gated form the block's output element as add_gated's kernel computes it.
#include "hc-combine.cuh"

namespace {

struct hc_combine_args {
    hc_combine_in in;
    float *       dst;  // [n_embd, hc, n_tokens], contiguous
    int64_t       n_embd, hc, n;
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
    const float sum = hc_combine_element(hc_block_output(a.in, e, t), a.in.residual[e + c * a.in.sr1 + t * a.in.sr2],
                                         a.in.inject[c * a.in.si0 + t * a.in.si1], a.in.scale);
    a.dst[i] = sum;
}

}  // namespace

hc_combine_in pyqsa_cuda_hc_combine_in(const ggml_tensor * comb) {
    const ggml_tensor * out      = comb->src[0];
    const ggml_tensor * residual = comb->src[1];
    const ggml_tensor * inject   = comb->src[2];
    const ggml_tensor * joined   = comb->src[3];
    const ggml_tensor * gate     = comb->src[4];
    return {
        (const float *) out->data,
        (const float *) residual->data,
        (const float *) inject->data,
        joined ? (const float *) joined->data : nullptr,
        gate ? (const float *) gate->data : nullptr,
        ggml_get_op_params_f32(comb, 1),
        (int64_t) (out->nb[1] / sizeof(float)),
        (int64_t) (residual->nb[1] / sizeof(float)),
        (int64_t) (residual->nb[2] / sizeof(float)),
        (int64_t) (inject->nb[0] / sizeof(float)),
        (int64_t) (inject->nb[1] / sizeof(float)),
        joined ? (int64_t) (joined->nb[1] / sizeof(float)) : 0,
        gate ? (int64_t) (gate->nb[1] / sizeof(float)) : 0,
    };
}

void pyqsa_cuda_hc_combine(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    GGML_ASSERT(ggml_is_contiguous(dst));
    const int64_t         n = ggml_nelements(dst);
    const hc_combine_args a = { pyqsa_cuda_hc_combine_in(dst), (float *) dst->data, dst->ne[0], dst->ne[1], n };
    constexpr int block = 256;
    const ggml_cuda_kernel_launch_params launch((unsigned) ((n + block - 1) / block), block, 0, ctx.stream());
    ggml_cuda_kernel_launch(hc_combine, launch, a);
}
