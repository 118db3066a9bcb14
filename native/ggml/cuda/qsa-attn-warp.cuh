// Device code shared by qsa_attn and qsa_attn_part (qsa-attn.cu, qsa-attn-part.cu): one warp's
// online softmax over a (head, query)'s cells, the CTA that stages the cells' K/V rows for the
// heads of a GQA group, the split of a cell list, and the merge of the splits' partial (acc, max,
// sum). Both ops run these same steps, so chained qsa_attn_part passes give qsa_attn's bits.
#pragma once

#include "ggml-cuda/common.cuh"

namespace pyqsa_attn {

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

struct args {
    const char *    q;
    const char *    k;
    const char *    v;
    const int32_t * cells;  // contiguous [n_sel, n_q, ns]
    float *         out;    // dst, or the partials [n_split, n_rows, H, D + 2]
    size_t q_nb1, q_nb2, q_nb3;
    size_t k_nb1, k_nb2, k_nb3;
    size_t v_nb1, v_nb2, v_nb3;
    size_t o_nb1, o_nb2, o_nb3;
    int    H, group, n_q, n_sel, n_split;
    float  scale;
    int    nw;    // warps (heads of one GQA group) per CTA
    int    rb;    // bytes of one K or V row of one KV head
    int    unit;  // bytes a lane copies at once (16, 8, 4 or 2: what the rows' alignment allows)
    int    tile;  // cells whose K and V rows fit the CTA's shared memory at once
};

// shared memory of a CTA: the staged cells' row indices, then K rows, then V rows
constexpr int STAGE_LIST = 32;
constexpr int STAGE_HEAD = STAGE_LIST * sizeof(int);

inline size_t stage_bytes(const args & a) {
    return STAGE_HEAD + 2 * (size_t) a.tile * a.rb;
}

// the fields every op of the family sets alike: q [D, H, n_q, ns], k/v [D, Hkv, rows, ns],
// cells [n_sel, n_q, ns], out [D, H, n_q, ns]
inline args make_args(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v, const ggml_tensor * cells,
                      ggml_tensor * out, float scale) {
    args a;
    a.q     = (const char *) q->data;
    a.k     = (const char *) k->data;
    a.v     = (const char *) v->data;
    a.cells = (const int32_t *) cells->data;
    a.out   = (float *) out->data;
    a.q_nb1 = q->nb[1];   a.q_nb2 = q->nb[2];   a.q_nb3 = q->nb[3];
    a.k_nb1 = k->nb[1];   a.k_nb2 = k->nb[2];   a.k_nb3 = k->nb[3];
    a.v_nb1 = v->nb[1];   a.v_nb2 = v->nb[2];   a.v_nb3 = v->nb[3];
    a.o_nb1 = out->nb[1]; a.o_nb2 = out->nb[2]; a.o_nb3 = out->nb[3];
    a.H     = (int) q->ne[1];
    a.group = (int) (q->ne[1] / k->ne[1]);
    a.n_q   = (int) q->ne[2];
    a.n_sel = (int) cells->ne[0];
    a.n_split = 1;
    a.scale = scale;
    // the largest divisor of the group up to 16 warps: a CTA's heads share one KV head
    a.nw = a.group < 16 ? a.group : 16;
    while (a.group % a.nw != 0) {
        --a.nw;
    }
    a.rb = (int) ggml_row_size(k->type, q->ne[0]);
    size_t align = (size_t) a.rb | (size_t) (uintptr_t) a.k | (size_t) (uintptr_t) a.v | a.k_nb1 | a.k_nb2 |
                   a.k_nb3 | a.v_nb1 | a.v_nb2 | a.v_nb3;
    a.unit = 16;
    while (a.unit > 2 && align % a.unit != 0) {
        a.unit /= 2;
    }
    const int budget = 40 * 1024 - STAGE_HEAD;  // under the 48 KiB a launch gets without opting in
    a.tile = budget / (2 * a.rb) < STAGE_LIST ? budget / (2 * a.rb) : STAGE_LIST;
    return a;
}

// the output row of head h for query row `row` (query row % n_q of stream row / n_q)
__device__ __forceinline__ float * out_row(const args & a, int h, int row) {
    return (float *) ((char *) a.out + h * a.o_nb1 + (size_t) (row % a.n_q) * a.o_nb2 +
                      (size_t) (row / a.n_q) * a.o_nb3);
}

// (acc, max, sum) of one (head, query, split) at `part`, laid out [n_split, n_rows, H, D + 2]
// (a kernel of grid (H, n_rows, ...))
template <int DPL, typename T>
__device__ __forceinline__ T * state_at(T * part, const args & a, int h, int row, int split) {
    return part + (((size_t) split * gridDim.y + row) * a.H + h) * (DPL * WARP + 2);
}

template <int DPL>
__device__ __forceinline__ void store_state(float * st, const float * acc, float m, float l, int lane) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        st[i * WARP + lane] = acc[i];
    }
    if (lane == 0) {
        st[DPL * WARP]     = m;
        st[DPL * WARP + 1] = l;
    }
}

// the result of one (head, query, split): the output row when there is one split, else the
// partial (acc, max, sum) for merge
template <int DPL>
__device__ __forceinline__ void write_partial(const args & a, const float * acc, float m, float l, int h, int row,
                                              int split, int lane) {
    if (a.n_split == 1) {
        float * out = out_row(a, h, row);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            out[i * WARP + lane] = acc[i] * inv;
        }
        return;
    }
    store_state<DPL>(state_at<DPL>(a.out, a, h, row, split), acc, m, l, lane);
}

// One warp's share of one (head, query, split): the query row and the online softmax over
// the cells added so far. Lane owns elements d = i*32 + lane (coalesced rows).
template <int DPL>
struct warp_attn {
    float qv[DPL];
    float acc[DPL] = {};
    float m        = -INFINITY;
    float l        = 0.0f;

    __device__ warp_attn(const args & a, int h, int row, int lane) {
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

// the bytes [0, rb) of a row, copied by the 32 lanes of a warp in units of `unit` bytes
__device__ __forceinline__ void copy_row(char * dst, const char * src, int rb, int unit, int lane) {
    switch (unit) {
        case 16:
            for (int o = lane * 16; o < rb; o += WARP * 16) *(int4 *) (dst + o) = *(const int4 *) (src + o);
            break;
        case 8:
            for (int o = lane * 8; o < rb; o += WARP * 8) *(int2 *) (dst + o) = *(const int2 *) (src + o);
            break;
        case 4:
            for (int o = lane * 4; o < rb; o += WARP * 4) *(int *) (dst + o) = *(const int *) (src + o);
            break;
        default:
            for (int o = lane * 2; o < rb; o += WARP * 2) *(short *) (dst + o) = *(const short *) (src + o);
            break;
    }
}

// One CTA of a.nw warps: heads blockIdx.x * nw .. + nw - 1 (one KV head), one query row, one
// split. A GQA group's heads read the same cells, so the CTA copies each cell's K and V rows to
// shared memory once and every warp adds them from there, in list order: each head's arithmetic is
// that of a lone warp reading global memory.
template <int DPL>
struct cta_attn {
    warp_attn<DPL> w;
    int            lane, warp, hk, s;
    int *          rows;  // [STAGE_LIST] rows of the cells being staged
    char *         kt;    // [tile][rb]
    char *         vt;    // [tile][rb]

    __device__ cta_attn(const args & a, int row, char * smem) :
        w(a, blockIdx.x * a.nw + threadIdx.x / WARP, row, threadIdx.x % WARP),
        lane(threadIdx.x % WARP),
        warp(threadIdx.x / WARP),
        hk(blockIdx.x * a.nw / a.group),
        s(row / a.n_q),
        rows((int *) smem),
        kt(smem + STAGE_HEAD),
        vt(smem + STAGE_HEAD + (size_t) a.tile * a.rb) {}

    __device__ int head(const args & a) const { return blockIdx.x * a.nw + warp; }

    // Up to 32 list entries, one a lane and alike in every warp of the CTA: the lanes whose `in`
    // holds take their cell, at K/V row `i`, in lane order. Every thread of the CTA calls this.
    template <ggml_type type>
    __device__ void add_rows(const args & a, bool in, int i) {
        const unsigned take = __ballot_sync(0xffffffffu, in);
        const int      n    = __popc(take);
        if (n == 0) {
            return;
        }
        if (warp == 0 && in) {
            rows[__popc(take & ((1u << lane) - 1u))] = i;
        }
        __syncthreads();
        for (int k0 = 0; k0 < n; k0 += a.tile) {
            const int m = min(a.tile, n - k0);
            for (int k = warp; k < m; k += a.nw) {
                const size_t off = (size_t) rows[k0 + k] * a.k_nb2 + (size_t) s * a.k_nb3 + (size_t) hk * a.k_nb1;
                const size_t vff = (size_t) rows[k0 + k] * a.v_nb2 + (size_t) s * a.v_nb3 + (size_t) hk * a.v_nb1;
                copy_row(kt + (size_t) k * a.rb, a.k + off, a.rb, a.unit, lane);
                copy_row(vt + (size_t) k * a.rb, a.v + vff, a.rb, a.unit, lane);
            }
            __syncthreads();
            for (int k = 0; k < m; ++k) {
                const char * krow = kt + (size_t) k * a.rb;
                const char * vrow = vt + (size_t) k * a.rb;
                w.add([&](int d) { return load_kv<type>(krow, d); }, [&](int d) { return load_kv<type>(vrow, d); },
                      a.scale, lane);
            }
            __syncthreads();
        }
    }
};

// the cells [j0, j1) of a query's list that split `split` takes
__device__ __forceinline__ void split_range(const args & a, int split, int & j0, int & j1) {
    const int chunk = (a.n_sel + a.n_split - 1) / a.n_split;
    j0              = split * chunk;
    j1              = min(a.n_sel, j0 + chunk);
}

// grid (H, n_q * ns), one warp: combine the n_split partials of one (head, query)
template <int DPL>
__global__ void merge(const float * part, const args a) {
    constexpr int D = DPL * WARP;
    const int lane = threadIdx.x;
    const int h    = blockIdx.x;
    const int row  = blockIdx.y;

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
    float * out = out_row(a, h, row);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        out[i * WARP + lane] = acc[i] * inv;
    }
}

// Runs partial(a') with a'.out = the partials when a.n_split > 1, then merges them into a.out;
// with one split partial writes a.out itself.
template <int DPL, typename Partial>
void run_split(ggml_backend_cuda_context & ctx, args a, int n_rows, const Partial & partial) {
    if (a.n_split == 1) {
        partial(a);
        return;
    }
    ggml_cuda_pool_alloc<float> part(ctx.pool(), (size_t) a.n_split * n_rows * a.H * (DPL * WARP + 2));
    args pa = a;
    pa.out  = part.get();
    partial(pa);
    merge<DPL><<<dim3(a.H, n_rows), WARP, 0, ctx.stream()>>>(part.get(), a);
    CUDA_CHECK(cudaGetLastError());
}

// f(DPL constant) for head dim D
template <typename F> void by_head_dim(int D, const F & f) {
    switch (D) {
        case 64:  f(std::integral_constant<int, 2>{}); break;
        case 128: f(std::integral_constant<int, 4>{}); break;
        case 256: f(std::integral_constant<int, 8>{}); break;
        case 512: f(std::integral_constant<int, 16>{}); break;
        default: GGML_ABORT("qsa_attn: head dim %d", D);
    }
}

// f(type constant) for the K/V type
template <typename F> void by_kv_type(ggml_type t, const F & f) {
    switch (t) {
        case GGML_TYPE_F32:  f(std::integral_constant<ggml_type, GGML_TYPE_F32>{}); break;
        case GGML_TYPE_F16:  f(std::integral_constant<ggml_type, GGML_TYPE_F16>{}); break;
        case GGML_TYPE_Q8_0: f(std::integral_constant<ggml_type, GGML_TYPE_Q8_0>{}); break;
        default: GGML_ABORT("qsa_attn: type %s", ggml_type_name(t));
    }
}

inline bool supported(const ggml_tensor * op) {
    const ggml_tensor * k = op->src[1];
    const int64_t D = op->src[0]->ne[0];
    const bool type_ok = k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_Q8_0;
    const bool d_ok = D == 64 || D == 128 || D == 256 || D == 512;
    return type_ok && d_ok && op->src[0]->ne[2] * op->src[0]->ne[3] <= 65535;
}

}  // namespace pyqsa_attn
