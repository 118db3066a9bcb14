// CUDA kernel of PYQSA_GGML_OP_SAMPLE, one CTA per row, the rules of pyqsa_sample_params
// (pyqsa.h) as the host sampler (native/ggml/sample-row.cpp) applies them:
//  1. the largest logit (lowest id on ties); with temperature 0 that is the token;
//  2. top_k and top_p are both "keep the rank-order prefix whose weight before an id is below a
//     target" (weight 1 and target k; weight exp(y - y_max) and target top_p * mass): a radix
//     walk (4 passes of 8 bits over order-preserving keys) finds the boundary key, and a pass in
//     id order the last tie kept, so a cut is a (key, id) pair tested on the fly;
//  3. Gumbel-max over the kept ids with the counter-based uniforms of sample-rng.h;
//  4. log-sum-exp of the row and the n_top best ids, one reduction each.
// Sums are f64 as on the host; their order differs, so a cut may differ at an f64 near-tie.
// Rows with logit adjustments are sampled from an adjusted copy (adjust_rows); the others from
// the logits themselves.
#include "sample.cuh"

#include "ordered-key.cuh"

#include "../sample-adjust.h"
#include "../sample-params.h"
#include "pyqsa-ggml.h"

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;
constexpr int BINS    = 256;

// (key desc, id asc) as one 64-bit word: the larger word ranks first
__device__ __forceinline__ uint64_t rank_word(uint32_t key, int id) {
    return ((uint64_t) key << 32) | (uint32_t) (0x7fffffff - id);
}

__device__ __forceinline__ int rank_word_id(uint64_t w) {
    return 0x7fffffff - (int) (uint32_t) w;
}

template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T * scratch) {
    for (int o = 16; o > 0; o /= 2) {
        v = op(v, __shfl_xor_sync(0xffffffff, v, o));
    }
    __syncthreads();  // scratch may still be read by a previous reduction
    if (threadIdx.x % 32 == 0) {
        scratch[threadIdx.x / 32] = v;
    }
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < WARPS; ++w) {
        v = op(v, scratch[w]);
    }
    return v;
}

// hist[bin] += w for every lane whose `take` holds, one atomic per distinct bin of the warp: a
// row's logits mostly share their top key byte (sign and high exponent bits), so an atomic per
// lane would queue a whole block on one or two bins. Every lane of the warp calls this.
__device__ __forceinline__ void warp_hist_add(double * hist, int bin, double w, bool take) {
    if (__ballot_sync(0xffffffff, take) == 0) {
        return;
    }
    const unsigned peers = __match_any_sync(0xffffffff, take ? bin : -1);
    double         sum   = 0;
    for (int k = 0; k < 32; ++k) {
        const double wk = __shfl_sync(0xffffffff, w, k);
        sum += (peers >> k) & 1u ? wk : 0.0;
    }
    if (take && __ffs(peers) - 1 == (int) (threadIdx.x % 32)) {
        atomicAdd(&hist[bin], sum);
    }
}

struct cut {
    uint32_t key;     // ids with a larger key are kept
    int      id_end;  // ids with this key are kept below this id
    __device__ bool keeps(uint32_t k, int id) const { return k > key || (k == key && id < id_end); }
};

struct row_ctx {
    const float * x;
    int           n;
    double        t, y_max, min_p;
    bool          by_min_p;
    cut           k_cut;  // top_k (everything when off)
    cut           p_cut;  // top_p (everything when off)

    __device__ double y(int i) const { return (double) x[i] / t; }
    __device__ bool before_top_p(int i) const {
        return k_cut.keeps(ordered_key(x[i]), i) && (!by_min_p || exp(y(i) - y_max) >= min_p);
    }
    __device__ bool kept(int i) const { return p_cut.keeps(ordered_key(x[i]), i) && before_top_p(i); }
};

// The prefix of the rank order whose weight before an id stays below `target`; weight(i) is 0
// for ids outside the set being cut. Returns the boundary key and the id end of its ties.
template <typename Weight> __device__ cut prefix_cut(const row_ctx & r, Weight weight, double target) {
    __shared__ double   hist[BINS];
    __shared__ uint32_t prefix;
    __shared__ double   above;  // weight of the keys above the current prefix's range
    __shared__ int      base, found;
    __shared__ int      tie_count[WARPS];
    if (threadIdx.x == 0) {
        prefix = 0;
        above  = 0;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        __syncthreads();
        for (int b = threadIdx.x; b < BINS; b += THREADS) {
            hist[b] = 0;
        }
        __syncthreads();
        const uint32_t high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int i0 = 0; i0 < r.n; i0 += THREADS) {  // whole warps at every iteration
            const int      i    = i0 + threadIdx.x;
            const uint32_t key  = i < r.n ? ordered_key(r.x[i]) : 0u;
            const double   w    = i < r.n ? weight(i) : 0.0;
            const bool     take = w > 0 && (key & high_mask) == prefix;
            warp_hist_add(hist, (int) ((key >> shift) & 0xff), w, take);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // from the top bin down, the first whose weight carries the sum to the target; if
            // rounding leaves none, the lowest bin that has any weight
            int b = BINS - 1, last = -1;
            for (; b >= 0; --b) {
                if (hist[b] > 0) {
                    last = b;
                    if (above + hist[b] >= target) {
                        break;
                    }
                    above += hist[b];
                }
            }
            if (b < 0 && last >= 0) {
                b = last;
                above -= hist[last];
            }
            b = max(b, 0);  // no weight at all: cannot happen with checked parameters
            prefix |= (uint32_t) b << shift;
        }
    }
    __syncthreads();
    const uint32_t key = prefix;
    // ties at the boundary key all weigh the same (equal logits): keep those whose weight
    // before them is still below the target, lowest ids first
    double w_tie = 0;
    for (int i = threadIdx.x; i < r.n && w_tie == 0; i += THREADS) {
        if (ordered_key(r.x[i]) == key) {
            w_tie = weight(i);
        }
    }
    __shared__ double scratch_d[WARPS];
    w_tie = block_reduce(w_tie, [](double a, double b) { return a > b ? a : b; }, scratch_d);
    // tie r (from 0) is kept while above + r * w_tie < target: keep = the first r that fails
    const double need = (target - above) / w_tie;
    int          keep = need <= 1 ? 1 : (int) fmin((double) r.n, ceil(need));
    while (keep > 1 && above + (keep - 1) * w_tie >= target) {
        --keep;
    }
    while (keep < r.n && above + keep * w_tie < target) {
        ++keep;
    }
    // the id after the keep-th tie (in id order) among the weighted ids with this key
    if (threadIdx.x == 0) {
        base  = 0;
        found = r.n;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i0 = 0; i0 < r.n; i0 += THREADS) {
        const int      i      = i0 + threadIdx.x;
        const bool     tie    = i < r.n && ordered_key(r.x[i]) == key && weight(i) > 0;
        const unsigned ballot = __ballot_sync(0xffffffff, tie);
        if (lane == 0) {
            tie_count[warp] = __popc(ballot);
        }
        __syncthreads();
        int rank = base + __popc(ballot & ((1u << lane) - 1));
        for (int w = 0; w < warp; ++w) {
            rank += tie_count[w];
        }
        if (tie && rank == keep - 1) {
            found = i + 1;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 0; w < WARPS; ++w) {
                base += tie_count[w];
            }
        }
        __syncthreads();
        if (found < r.n || base >= keep) {
            break;
        }
    }
    return cut{ key, found };
}

__global__ void __launch_bounds__(THREADS) sample_rows(const float * logits, const float * adjusted, const int * used,
                            const pyqsa_sample_params * params, pyqsa_sample_result * out, int n) {
    const bool                  adj = used != nullptr && used[blockIdx.x];
    const float *               x   = (adj ? adjusted : logits) + (size_t) blockIdx.x * n;
    const pyqsa_sample_params   p = pyqsa_sample_params_checked(params[blockIdx.x], n);
    pyqsa_sample_result &       o = out[blockIdx.x];
    __shared__ uint64_t         scratch_w[WARPS];
    __shared__ double           scratch_d[WARPS];
    const auto max_word = [](uint64_t a, uint64_t b) { return a > b ? a : b; };

    uint64_t best_w = 0;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        best_w = max(best_w, rank_word(ordered_key(x[i]), i));
    }
    best_w         = block_reduce(best_w, max_word, scratch_w);
    const int best = rank_word_id(best_w);

    int token = best;
    if (p.temperature > 0) {
        row_ctx r{ x, n, (double) p.temperature, (double) x[best] / p.temperature, (double) p.min_p,
                   p.min_p > 0, cut{ 0u, n }, cut{ 0u, n } };
        if (p.top_k > 0) {
            r.k_cut = prefix_cut(r, [](int) { return 1.0; }, (double) p.top_k);
        }
        if (p.top_p < 1) {
            double z = 0;
            for (int i = threadIdx.x; i < n; i += THREADS) {
                z += r.before_top_p(i) ? exp(r.y(i) - r.y_max) : 0.0;
            }
            z = block_reduce(z, [](double a, double b) { return a + b; }, scratch_d);
            r.p_cut = prefix_cut(
                r, [&r](int i) { return r.before_top_p(i) ? exp(r.y(i) - r.y_max) : 0.0; }, (double) p.top_p * z);
        }
        // Gumbel-max over the kept ids: the largest y - log(-log(u)), the lowest id on ties
        const uint64_t key   = pyqsa_draw_key((uint64_t) p.seed_lo | ((uint64_t) p.seed_hi << 32), p.counter);
        double         top   = -INFINITY;
        int            top_i = n;
        for (int i = threadIdx.x; i < n; i += THREADS) {
            if (r.kept(i)) {
                const double score = r.y(i) - log(-log(pyqsa_draw_uniform(key, i)));
                if (score > top) {
                    top   = score;
                    top_i = i;
                }
            }
        }
        for (int o2 = 16; o2 > 0; o2 /= 2) {
            const double s2 = __shfl_xor_sync(0xffffffff, top, o2);
            const int    i2 = __shfl_xor_sync(0xffffffff, top_i, o2);
            if (s2 > top || (s2 == top && i2 < top_i)) {
                top   = s2;
                top_i = i2;
            }
        }
        __shared__ double s_top[WARPS];
        __shared__ int    s_id[WARPS];
        __syncthreads();
        if (threadIdx.x % 32 == 0) {
            s_top[threadIdx.x / 32] = top;
            s_id[threadIdx.x / 32]  = top_i;
        }
        __syncthreads();
        top   = s_top[0];
        token = s_id[0];
        for (int w = 1; w < WARPS; ++w) {
            if (s_top[w] > top || (s_top[w] == top && s_id[w] < token)) {
                top   = s_top[w];
                token = s_id[w];
            }
        }
    }

    if (threadIdx.x < 20) {
        o.top_ids[threadIdx.x]      = -1;
        o.top_logprobs[threadIdx.x] = 0.0f;
    }
    if (threadIdx.x == 0) {
        o.token   = token;
        o.logprob = NAN;
    }
    if (p.n_top < 0) {
        return;
    }
    double sum = 0;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        sum += exp((double) x[i] - (double) x[best]);
    }
    sum              = block_reduce(sum, [](double a, double b) { return a + b; }, scratch_d);
    const double lse = (double) x[best] + log(sum);
    if (threadIdx.x == 0) {
        o.logprob = (float) ((double) x[token] - lse);
    }
    // the n_top best: each the largest rank word below the previous one
    uint64_t prev = best_w;
    for (int j = 0; j < min(p.n_top, n); ++j) {
        if (j > 0) {
            uint64_t w = 0;
            for (int i = threadIdx.x; i < n; i += THREADS) {
                const uint64_t wi = rank_word(ordered_key(x[i]), i);
                w                 = wi < prev ? max(w, wi) : w;
            }
            prev = block_reduce(w, max_word, scratch_w);
        }
        if (threadIdx.x == 0) {
            const int id      = rank_word_id(prev);
            o.top_ids[j]      = id;
            o.top_logprobs[j] = (float) ((double) x[id] - lse);
        }
    }
}

// grid (n_rows), ADJUST_THREADS: row r's adjusted copy, when its list (ended by its first
// negative id) has any entry; used[r] says whether sample_rows reads the copy or the logits, so
// a row without adjustments costs a look at its list
constexpr int ADJUST_THREADS = 256;

__global__ void adjust_rows(const float * logits, float * copy, int * used, int n, const pyqsa_logit_adjust * adjust,
                            int max_adjust) {
    const pyqsa_logit_adjust * list = adjust + (size_t) blockIdx.x * max_adjust;
    const float *              x    = logits + (size_t) blockIdx.x * n;
    float *                    y    = copy + (size_t) blockIdx.x * n;
    __shared__ int             end;
    if (threadIdx.x == 0) {
        end = max_adjust;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < max_adjust; j += ADJUST_THREADS) {
        if (list[j].id < 0) {
            atomicMin(&end, j);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        used[blockIdx.x] = end > 0;
    }
    if (end == 0) {
        return;
    }
    for (int i = threadIdx.x; i < n; i += ADJUST_THREADS) {
        y[i] = x[i];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < end; j += ADJUST_THREADS) {  // distinct ids: no write races
        const pyqsa_logit_adjust a = list[j];
        if (a.id < n) {
            y[a.id] = pyqsa_adjusted_logit(x[a.id], a);
        }
    }
}

}  // namespace

bool pyqsa_cuda_sample_supported(const ggml_tensor * op) {
    return ggml_is_contiguous(op->src[0]) && ggml_nrows(op->src[0]) <= 65535;
}

void pyqsa_cuda_sample(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * logits = dst->src[0];
    const ggml_tensor * adjust = dst->src[2];  // [4, max_adjust, rows] or null
    const int           rows   = (int) logits->ne[1];
    const int           n      = (int) logits->ne[0];
    cudaStream_t        stream = ctx.stream();
    const float *       x      = (const float *) logits->data;
    ggml_cuda_pool_alloc<float> adjusted(ctx.pool());
    ggml_cuda_pool_alloc<int>   used(ctx.pool());
    if (adjust != nullptr) {
        adjusted.alloc((size_t) rows * n);
        used.alloc(rows);
        adjust_rows<<<rows, ADJUST_THREADS, 0, stream>>>(x, adjusted.get(), used.get(), n,
                                                         (const pyqsa_logit_adjust *) adjust->data,
                                                         (int) adjust->ne[1]);
        CUDA_CHECK(cudaGetLastError());
    }
    sample_rows<<<rows, THREADS, 0, stream>>>(x, adjusted.get(), used.get(),
                                              (const pyqsa_sample_params *) dst->src[1]->data,
                                              (pyqsa_sample_result *) dst->data, n);
    CUDA_CHECK(cudaGetLastError());
}
