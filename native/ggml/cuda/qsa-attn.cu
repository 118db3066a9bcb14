// CUDA kernel of PYQSA_GGML_OP_QSA_ATTN, flash-decoding style: the cell list of every
// (query, head) is split across CTAs (split-K); each warp keeps an online softmax over its share
// and a second kernel merges the partial (max, sum, acc) triples. Correctness first: one warp per
// (head, query, split), K/V rows re-read per head of a GQA group (served by L2); cell lists that
// read host memory go through a variant whose CTA shares each row among the group's heads.
#include "qsa-attn.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"

namespace {

constexpr int WARP = 32;

template <ggml_type type> __device__ __forceinline__ float load_kv(const char * row, int d);

template <> __device__ __forceinline__ float load_kv<GGML_TYPE_F32>(const char * row, int d) {
    return ((const float *) row)[d];
}

template <> __device__ __forceinline__ float load_kv<GGML_TYPE_F16>(const char * row, int d) {
    return __half2float(((const half *) row)[d]);
}

template <> __device__ __forceinline__ float load_kv<GGML_TYPE_Q8_0>(const char * row, int d) {
    const block_q8_0 * b = (const block_q8_0 *) row + d / QK8_0;
    return __half2float(b->d) * b->qs[d % QK8_0];
}

struct qsa_attn_args {
    const char *    q;
    const char *    k;
    const char *    v;
    const int32_t * cells;   // contiguous [n_sel, n_q, ns]
    const char *    k_host;  // cells >= n_kv: rows of the host store (pinned), or null
    const char *    v_host;
    long long       n_host;  // host rows per stream
    int             n_kv;
    float *         out;     // dst, or the partials [n_split, n_rows, H, D + 2]
    size_t q_nb1, q_nb2, q_nb3;
    size_t k_nb1, k_nb2, k_nb3;
    size_t v_nb1, v_nb2, v_nb3;
    size_t o_nb1, o_nb2, o_nb3;
    int    H, group, n_q, n_sel, n_split;
    float  scale;
};

// the result of one (head, query, split): the output row when there is one split, else the
// partial (acc, max, sum) for qsa_attn_merge
template <int DPL>
__device__ __forceinline__ void write_partial(const qsa_attn_args & a, const float * acc, float m, float l, int h, int row,
                                              int split, int lane) {
    constexpr int D  = DPL * WARP;
    const int     iq = row % a.n_q;
    const int     s  = row / a.n_q;
    if (a.n_split == 1) {
        float * out = (float *) ((char *) a.out + h * a.o_nb1 + iq * a.o_nb2 + s * a.o_nb3);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            out[i * WARP + lane] = acc[i] * inv;
        }
        return;
    }
    float * part = a.out + (((size_t) split * gridDim.y + row) * a.H + h) * (D + 2);
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        part[i * WARP + lane] = acc[i];
    }
    if (lane == 0) {
        part[D]     = m;
        part[D + 1] = l;
    }
}

// One warp's share of one (head, query, split): the query row and the online softmax over
// the cells added so far. Lane owns elements d = i*32 + lane (coalesced rows).
template <int DPL>
struct warp_attn {
    float qv[DPL];
    float acc[DPL] = {};
    float m        = -INFINITY;
    float l        = 0.0f;

    __device__ warp_attn(const qsa_attn_args & a, int h, int row, int lane) {
        const float * qrow = (const float *) (a.q + h * a.q_nb1 + (row % a.n_q) * a.q_nb2 + (row / a.n_q) * a.q_nb3);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            qv[i] = qrow[i * WARP + lane];
        }
    }

    // one cell: k(d) and v(d) give its K and V elements as f32
    template <typename K, typename V>
    __device__ void add(const K & k, const V & v, float scale, int lane) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            dot += qv[i] * k(i * WARP + lane);
        }
        dot = warp_reduce_sum(dot);
        const float score = dot * scale;
        const float m_new = fmaxf(m, score);
        const float old_w = expf(m - m_new);
        const float new_w = expf(score - m_new);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            acc[i] = acc[i] * old_w + new_w * v(i * WARP + lane);
        }
        l = l * old_w + new_w;
        m = m_new;
    }
};

// the cells [j0, j1) of a query's list that split `split` takes
__device__ __forceinline__ void split_range(const qsa_attn_args & a, int split, int & j0, int & j1) {
    const int chunk = (a.n_sel + a.n_split - 1) / a.n_split;
    j0              = split * chunk;
    j1              = min(a.n_sel, j0 + chunk);
}

// the K (or V) row of cell c, stream s, KV head hk: device rows below n_kv, host rows past it
__device__ __forceinline__ const char * kv_row(const qsa_attn_args & a, bool v, int c, int s, int hk) {
    const char * dev   = v ? a.v : a.k;
    const char * host  = v ? a.v_host : a.k_host;
    const size_t nb1   = v ? a.v_nb1 : a.k_nb1;
    const size_t nb2   = v ? a.v_nb2 : a.k_nb2;
    const size_t nb3   = v ? a.v_nb3 : a.k_nb3;
    const char * start = c >= a.n_kv ? host + ((size_t) s * a.n_host + (c - a.n_kv)) * nb2 : dev + (size_t) c * nb2 + s * nb3;
    return start + hk * nb1;
}

// grid (H, n_q * ns, n_split), one warp per (head, query, split)
template <ggml_type type, int DPL>
__global__ void qsa_attn_partial(const qsa_attn_args a) {
    const int lane  = threadIdx.x;
    const int h     = blockIdx.x;
    const int row   = blockIdx.y;
    const int split = blockIdx.z;
    const int s     = row / a.n_q;
    const int hk    = h / a.group;

    warp_attn<DPL>  w(a, h, row, lane);
    const int32_t * list = a.cells + (size_t) row * a.n_sel;
    int             j0, j1;
    split_range(a, split, j0, j1);
    for (int j = j0; j < j1; ++j) {
        const int c = list[j];
        if (c < 0) {
            continue;
        }
        const char * krow = kv_row(a, false, c, s, hk);
        const char * vrow = kv_row(a, true, c, s, hk);
        w.add([&](int d) { return load_kv<type>(krow, d); }, [&](int d) { return load_kv<type>(vrow, d); }, a.scale,
              lane);
    }
    write_partial<DPL>(a, w.acc, w.m, w.l, h, row, split, lane);
}

// grid (Hkv, n_q * ns, n_split), one warp per query head of the GQA group: the group's CTA
// reads each listed cell's K and V row once into shared memory for all its heads. For cell
// lists that read host memory (pyqsa_ggml_qsa_attn_set_host), where a row re-read per head
// would cross the host link once per head.
template <ggml_type type, int DPL>
__global__ void qsa_attn_partial_gqa(const qsa_attn_args a) {
    constexpr int D = DPL * WARP;
    __shared__ float kv[2 * D];  // the cell's K row, then its V row, as f32
    const int lane  = threadIdx.x % WARP;
    const int hk    = blockIdx.x;
    const int h     = hk * a.group + threadIdx.x / WARP;
    const int row   = blockIdx.y;
    const int split = blockIdx.z;
    const int s     = row / a.n_q;

    warp_attn<DPL>  w(a, h, row, lane);
    const int32_t * list = a.cells + (size_t) row * a.n_sel;
    int             j0, j1;
    split_range(a, split, j0, j1);
    for (int j = j0; j < j1; ++j) {
        const int c = list[j];  // the same for the whole CTA
        if (c < 0) {
            continue;
        }
        const char * krow = kv_row(a, false, c, s, hk);
        const char * vrow = kv_row(a, true, c, s, hk);
        __syncthreads();  // every head is done with the previous cell's rows
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            kv[d]     = load_kv<type>(krow, d);
            kv[D + d] = load_kv<type>(vrow, d);
        }
        __syncthreads();
        w.add([&](int d) { return kv[d]; }, [&](int d) { return kv[D + d]; }, a.scale, lane);
    }
    write_partial<DPL>(a, w.acc, w.m, w.l, h, row, split, lane);
}

// grid (H, n_q * ns), one warp: combine the n_split partials of one (head, query)
template <int DPL>
__global__ void qsa_attn_merge(const float * part, const qsa_attn_args a) {
    constexpr int D = DPL * WARP;
    const int lane = threadIdx.x;
    const int h    = blockIdx.x;
    const int row  = blockIdx.y;
    const int iq   = row % a.n_q;
    const int s    = row / a.n_q;

    const size_t stride = (size_t) gridDim.y * a.H * (D + 2);
    const float * p0    = part + ((size_t) row * a.H + h) * (D + 2);

    float m = -INFINITY;
    for (int sp = 0; sp < a.n_split; ++sp) {
        m = fmaxf(m, p0[sp * stride + D]);
    }
    float l = 0.0f;
    float acc[DPL] = {};
    if (m > -INFINITY) {
        for (int sp = 0; sp < a.n_split; ++sp) {
            const float * p = p0 + sp * stride;
            const float   w = expf(p[D] - m);  // 0 for an empty split (max -inf)
            l += w * p[D + 1];
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                acc[i] += w * p[i * WARP + lane];
            }
        }
    }
    float * out = (float *) ((char *) a.out + h * a.o_nb1 + iq * a.o_nb2 + s * a.o_nb3);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        out[i * WARP + lane] = acc[i] * inv;
    }
}

template <ggml_type type, int DPL>
void launch_partial(const qsa_attn_args & a, int n_rows, cudaStream_t stream) {
    if (a.k_host != nullptr) {  // a GQA group's heads share each row read
        qsa_attn_partial_gqa<type, DPL><<<dim3(a.H / a.group, n_rows, a.n_split), a.group * WARP, 0, stream>>>(a);
    } else {
        qsa_attn_partial<type, DPL><<<dim3(a.H, n_rows, a.n_split), WARP, 0, stream>>>(a);
    }
    CUDA_CHECK(cudaGetLastError());
}

template <ggml_type type, int DPL>
void launch(ggml_backend_cuda_context & ctx, qsa_attn_args a, int n_rows) {
    cudaStream_t stream = ctx.stream();
    if (a.n_split == 1) {
        launch_partial<type, DPL>(a, n_rows, stream);
        return;
    }
    float * dst = a.out;
    ggml_cuda_pool_alloc<float> part(ctx.pool(), (size_t) a.n_split * n_rows * a.H * (DPL * WARP + 2));
    a.out = part.get();
    launch_partial<type, DPL>(a, n_rows, stream);
    a.out = dst;
    qsa_attn_merge<DPL><<<dim3(a.H, n_rows), WARP, 0, stream>>>(part.get(), a);
    CUDA_CHECK(cudaGetLastError());
}

template <ggml_type type>
void launch_d(ggml_backend_cuda_context & ctx, const qsa_attn_args & a, int D, int n_rows) {
    switch (D) {
        case 64:  launch<type, 2>(ctx, a, n_rows); break;
        case 128: launch<type, 4>(ctx, a, n_rows); break;
        case 256: launch<type, 8>(ctx, a, n_rows); break;
        case 512: launch<type, 16>(ctx, a, n_rows); break;
        default: GGML_ABORT("qsa_attn: head dim %d", D);
    }
}

}  // namespace

bool pyqsa_cuda_qsa_attn_supported(const ggml_tensor * op) {
    const ggml_tensor * k = op->src[1];
    const int64_t D = op->src[0]->ne[0];
    const bool type_ok = k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_Q8_0;
    const bool d_ok = D == 64 || D == 128 || D == 256 || D == 512;
    // host rows are read in place: pinned memory only (pyqsa_ggml_qsa_attn_set_host)
    const void * k_host  = pyqsa_ggml_host_ptr(op, 2);
    // (the host-reading kernel runs a GQA group's heads in one CTA, a warp each)
    const bool   host_ok = k_host == nullptr || (pyqsa_cuda_host_mapped(k_host) &&
                                                 pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 4)) &&
                                                 op->src[0]->ne[1] / k->ne[1] <= 32);
    return type_ok && d_ok && host_ok && op->src[0]->ne[2] * op->src[0]->ne[3] <= 65535;
}

void pyqsa_cuda_qsa_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];  // [D, H, n_q, ns]
    const ggml_tensor * k     = dst->src[1];  // [D, Hkv, n_kv, ns]
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * cells = dst->src[3];  // [n_sel, n_q, ns]

    qsa_attn_args a;
    a.q     = (const char *) q->data;
    a.k     = (const char *) k->data;
    a.v     = (const char *) v->data;
    a.cells = (const int32_t *) cells->data;
    a.k_host = (const char *) pyqsa_ggml_host_ptr(dst, 2);
    a.v_host = (const char *) pyqsa_ggml_host_ptr(dst, 4);
    a.n_host = ggml_get_op_params_i32(dst, 6);
    a.n_kv   = (int) k->ne[2];
    a.out   = (float *) dst->data;
    a.q_nb1 = q->nb[1];   a.q_nb2 = q->nb[2];   a.q_nb3 = q->nb[3];
    a.k_nb1 = k->nb[1];   a.k_nb2 = k->nb[2];   a.k_nb3 = k->nb[3];
    a.v_nb1 = v->nb[1];   a.v_nb2 = v->nb[2];   a.v_nb3 = v->nb[3];
    a.o_nb1 = dst->nb[1]; a.o_nb2 = dst->nb[2]; a.o_nb3 = dst->nb[3];
    a.H     = (int) q->ne[1];
    a.group = (int) (q->ne[1] / k->ne[1]);
    a.n_q   = (int) q->ne[2];
    a.n_sel = (int) cells->ne[0];
    a.scale = ggml_get_op_params_f32(dst, 1);

    const int n_rows = (int) (q->ne[2] * q->ne[3]);
    // enough CTAs to fill the GPU at decode, none wasted when many queries already do; the
    // host-reading variant splits alike, so both kernels give the same bits
    const int ctas   = n_rows * a.H;
    a.n_split = std::max(1, std::min((a.n_sel + 63) / 64, 4096 / std::max(1, ctas)));

    const int D = (int) q->ne[0];
    switch (k->type) {
        case GGML_TYPE_F32:  launch_d<GGML_TYPE_F32>(ctx, a, D, n_rows); break;
        case GGML_TYPE_F16:  launch_d<GGML_TYPE_F16>(ctx, a, D, n_rows); break;
        case GGML_TYPE_Q8_0: launch_d<GGML_TYPE_Q8_0>(ctx, a, D, n_rows); break;
        default: GGML_ABORT("qsa_attn: type %s", ggml_type_name(k->type));
    }
}
