// CUDA kernel of PYQSA_GGML_OP_SAMPLE, one thread-block cluster of CLUSTER CTAs per row (each
// CTA a contiguous slice of the row; reductions and histograms meet in distributed shared
// memory), the rules of pyqsa_sample_params (pyqsa.h) as the host sampler
// (native/ggml/sample-row.cpp) applies them:
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
// NOTE: a cluster per row, not a CTA, and the ops of a graph's run of sample ops in one launch
// (pyqsa_cuda_sample_fuse): llama.cpp's backend sampling gives each sequence's sampler its own
// one-row op, so a step would run one launch per sequence, one after another, each paying a whole
// row's latency (35 us a row for the Qwen vocabulary on the H200, 8 launches a step with 8 slots).
#include "sample.cuh"

#include "ordered-key.cuh"
#include "pyqsa-cuda.cuh"

#include "../sample-adjust.h"
#include "../sample-params.h"
#include "pyqsa-ggml.h"

#include <algorithm>
#include <cooperative_groups.h>
#include <vector>

namespace cg = cooperative_groups;

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS   = THREADS / 32;
constexpr int BINS    = 256;
constexpr int CLUSTER = 8;  // CTAs a row (the portable cluster size)
constexpr int MAX_LAUNCH_ROWS = 32;  // rows one launch takes (its table is a kernel parameter)

// one row of a launch: where its logits, parameters, adjustment list and result are
struct row_ref {
    const float *               logits;  // [n]
    const pyqsa_sample_params * params;
    const pyqsa_logit_adjust *  adjust;  // [max_adjust] ended by its first negative id, or null
    int                         max_adjust;
    pyqsa_sample_result *       out;
};

struct launch_rows {
    row_ref rows[MAX_LAUNCH_ROWS];
    int     n_rows;
    int     n;  // the rows' length (vocabulary)
};

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

// op over every thread of the cluster: each CTA's value, then the CTAs' values in rank order
// (the same result in every thread of every CTA)
template <typename T, typename Op> __device__ T cluster_reduce(T v, Op op) {
    __shared__ T scratch[WARPS];
    __shared__ T mine;
    cg::cluster_group cluster = cg::this_cluster();
    v = block_reduce(v, op, scratch);
    if (threadIdx.x == 0) {
        mine = v;
    }
    cluster.sync();
    v = *cluster.map_shared_rank(&mine, 0);
    for (int k = 1; k < CLUSTER; ++k) {
        v = op(v, *cluster.map_shared_rank(&mine, k));
    }
    cluster.sync();  // every CTA has read `mine` before it is written again
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
    int           lo, hi;  // this CTA's slice of the row
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
// for ids outside the set being cut. Returns the boundary key and the id end of its ties (the
// same in every CTA of the cluster: each sums the CTAs' histograms in rank order).
template <typename Weight> __device__ cut prefix_cut(const row_ctx & r, Weight weight, double target) {
    __shared__ double   hist[BINS];   // this CTA's slice
    __shared__ double   total[BINS];  // the row's, summed over the cluster
    __shared__ uint32_t prefix;
    __shared__ double   above;  // weight of the keys above the current prefix's range
    __shared__ int      tie_count[WARPS];
    cg::cluster_group   cluster = cg::this_cluster();
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
        for (int i0 = r.lo; i0 < r.hi; i0 += THREADS) {  // whole warps at every iteration
            const int      i    = i0 + threadIdx.x;
            const uint32_t key  = i < r.hi ? ordered_key(r.x[i]) : 0u;
            const double   w    = i < r.hi ? weight(i) : 0.0;
            const bool     take = w > 0 && (key & high_mask) == prefix;
            warp_hist_add(hist, (int) ((key >> shift) & 0xff), w, take);
        }
        cluster.sync();  // every CTA's histogram is complete
        for (int b = threadIdx.x; b < BINS; b += THREADS) {
            double sum = 0;
            for (int k = 0; k < CLUSTER; ++k) {
                sum += cluster.map_shared_rank(hist, k)[b];
            }
            total[b] = sum;
        }
        cluster.sync();  // every CTA has read the histograms before they are cleared
        if (threadIdx.x == 0) {
            // from the top bin down, the first whose weight carries the sum to the target; if
            // rounding leaves none, the lowest bin that has any weight
            int b = BINS - 1, last = -1;
            for (; b >= 0; --b) {
                if (total[b] > 0) {
                    last = b;
                    if (above + total[b] >= target) {
                        break;
                    }
                    above += total[b];
                }
            }
            if (b < 0 && last >= 0) {
                b = last;
                above -= total[last];
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
    for (int i = r.lo + threadIdx.x; i < r.hi && w_tie == 0; i += THREADS) {
        if (ordered_key(r.x[i]) == key) {
            w_tie = weight(i);
        }
    }
    w_tie = cluster_reduce(w_tie, [](double a, double b) { return a > b ? a : b; });
    // tie r (from 0) is kept while above + r * w_tie < target: keep = the first r that fails
    const double need = (target - above) / w_tie;
    int          keep = need <= 1 ? 1 : (int) fmin((double) r.n, ceil(need));
    while (keep > 1 && above + (keep - 1) * w_tie >= target) {
        --keep;
    }
    while (keep < r.n && above + keep * w_tie < target) {
        ++keep;
    }
    // the id after the keep-th tie (in id order) among the weighted ids with this key: the
    // slices' tie counts say which CTA holds it, that CTA finds it in its slice
    const auto tie_at = [&](int i) { return i < r.hi && ordered_key(r.x[i]) == key && weight(i) > 0; };
    int        mine   = 0;
    for (int i = r.lo + threadIdx.x; i < r.hi; i += THREADS) {
        mine += tie_at(i);
    }
    __shared__ int counts[WARPS];
    mine = block_reduce(mine, [](int a, int b) { return a + b; }, counts);
    __shared__ int slice_ties;
    if (threadIdx.x == 0) {
        slice_ties = mine;
    }
    cluster.sync();
    int base = 0;  // ties in the lower-ranked slices
    for (unsigned k = 0; k < cluster.block_rank(); ++k) {
        base += *cluster.map_shared_rank(&slice_ties, k);
    }
    cluster.sync();
    int found = r.n;
    if (base < keep && keep <= base + mine) {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        for (int i0 = r.lo; i0 < r.hi; i0 += THREADS) {  // whole warps at every iteration
            const int      i      = i0 + threadIdx.x;
            const bool     tie    = tie_at(i);
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
                counts[0] = i + 1;  // (counts is free again: one thread writes it)
            }
            for (int w = 0; w < WARPS; ++w) {
                base += tie_count[w];
            }
            __syncthreads();
            if (base >= keep) {
                found = counts[0];
                break;
            }
        }
    }
    found = cluster_reduce(found, [](int a, int b) { return a < b ? a : b; });
    return cut{ key, found };
}

// grid (CLUSTER * t.n_rows), clusters of CLUSTER CTAs: row blockIdx.x / CLUSTER of the table;
// `adjusted` [n, n_rows] holds the adjusted copies of the rows whose `used` is set
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
    sample_rows(const __grid_constant__ launch_rows t, const float * adjusted, const int * used) {
    cg::cluster_group         cluster = cg::this_cluster();
    const int                 row     = blockIdx.x / CLUSTER;
    const int                 n       = t.n;
    const int                 rank    = (int) cluster.block_rank();
    const int                 slice   = (n + CLUSTER - 1) / CLUSTER;
    const int                 lo      = min(n, rank * slice);
    const int                 hi      = min(n, lo + slice);
    const bool                adj     = used != nullptr && used[row];
    const float *             x       = adj ? adjusted + (size_t) row * n : t.rows[row].logits;
    const pyqsa_sample_params p       = pyqsa_sample_params_checked(*t.rows[row].params, n);
    pyqsa_sample_result &     o       = *t.rows[row].out;
    const auto max_word = [](uint64_t a, uint64_t b) { return a > b ? a : b; };
    const auto sum      = [](double a, double b) { return a + b; };

    uint64_t best_w = 0;
    for (int i = lo + threadIdx.x; i < hi; i += THREADS) {
        best_w = max(best_w, rank_word(ordered_key(x[i]), i));
    }
    best_w         = cluster_reduce(best_w, max_word);
    const int best = rank_word_id(best_w);

    int token = best;
    if (p.temperature > 0) {
        row_ctx r{ x, n, lo, hi, (double) p.temperature, (double) x[best] / p.temperature, (double) p.min_p,
                   p.min_p > 0, cut{ 0u, n }, cut{ 0u, n } };
        if (p.top_k > 0) {
            r.k_cut = prefix_cut(r, [](int) { return 1.0; }, (double) p.top_k);
        }
        if (p.top_p < 1) {
            double z = 0;
            for (int i = lo + threadIdx.x; i < hi; i += THREADS) {
                z += r.before_top_p(i) ? exp(r.y(i) - r.y_max) : 0.0;
            }
            z       = cluster_reduce(z, sum);
            r.p_cut = prefix_cut(
                r, [&r](int i) { return r.before_top_p(i) ? exp(r.y(i) - r.y_max) : 0.0; }, (double) p.top_p * z);
        }
        // Gumbel-max over the kept ids: the largest y - log(-log(u)), the lowest id on ties, as
        // one word per id: the score's order-preserving key (scores are finite) and the id
        const uint64_t key = pyqsa_draw_key((uint64_t) p.seed_lo | ((uint64_t) p.seed_hi << 32), p.counter);
        double         top   = -INFINITY;
        int            top_i = n;
        for (int i = lo + threadIdx.x; i < hi; i += THREADS) {
            if (r.kept(i)) {
                const double score = r.y(i) - log(-log(pyqsa_draw_uniform(key, i)));
                if (score > top) {
                    top   = score;
                    top_i = i;
                }
            }
        }
        struct scored {
            double score;
            int    id;
        };
        const auto better = [](scored a, scored b) {
            return a.score > b.score || (a.score == b.score && a.id < b.id) ? a : b;
        };
        scored s{ top, top_i };
        for (int o2 = 16; o2 > 0; o2 /= 2) {
            s = better(s, scored{ __shfl_xor_sync(0xffffffff, s.score, o2), __shfl_xor_sync(0xffffffff, s.id, o2) });
        }
        __shared__ scored warp_best[WARPS];
        __shared__ scored cta_best;
        __syncthreads();
        if (threadIdx.x % 32 == 0) {
            warp_best[threadIdx.x / 32] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            scored b = warp_best[0];
            for (int w = 1; w < WARPS; ++w) {
                b = better(b, warp_best[w]);
            }
            cta_best = b;
        }
        cluster.sync();
        scored b = *cluster.map_shared_rank(&cta_best, 0);
        for (int k = 1; k < CLUSTER; ++k) {
            b = better(b, *cluster.map_shared_rank(&cta_best, k));
        }
        cluster.sync();
        token = b.id;
    }

    const bool writes = rank == 0;  // one CTA writes the row's result
    if (writes && threadIdx.x < 20) {
        o.top_ids[threadIdx.x]      = -1;
        o.top_logprobs[threadIdx.x] = 0.0f;
    }
    if (writes && threadIdx.x == 0) {
        o.token   = token;
        o.logprob = NAN;
    }
    if (p.n_top < 0) {
        return;
    }
    double z = 0;
    for (int i = lo + threadIdx.x; i < hi; i += THREADS) {
        z += exp((double) x[i] - (double) x[best]);
    }
    z                = cluster_reduce(z, sum);
    const double lse = (double) x[best] + log(z);
    if (writes && threadIdx.x == 0) {
        o.logprob = (float) ((double) x[token] - lse);
    }
    // the n_top best: each the largest rank word below the previous one
    uint64_t prev = best_w;
    for (int j = 0; j < min(p.n_top, n); ++j) {
        if (j > 0) {
            uint64_t w = 0;
            for (int i = lo + threadIdx.x; i < hi; i += THREADS) {
                const uint64_t wi = rank_word(ordered_key(x[i]), i);
                w                 = wi < prev ? max(w, wi) : w;
            }
            prev = cluster_reduce(w, max_word);
        }
        if (writes && threadIdx.x == 0) {
            const int id      = rank_word_id(prev);
            o.top_ids[j]      = id;
            o.top_logprobs[j] = (float) ((double) x[id] - lse);
        }
    }
}

// grid (t.n_rows), ADJUST_THREADS: row r's adjusted copy, when its list (ended by its first
// negative id) has any entry; used[r] says whether sample_rows reads the copy or the logits, so
// a row without adjustments costs a look at its list
constexpr int ADJUST_THREADS = 256;

__global__ void adjust_rows(const __grid_constant__ launch_rows t, float * copy, int * used) {
    const row_ref &            ref  = t.rows[blockIdx.x];
    const pyqsa_logit_adjust * list = ref.adjust;
    const int                  n    = t.n;
    const float *              x    = ref.logits;
    float *                    y    = copy + (size_t) blockIdx.x * n;
    __shared__ int             end;
    if (threadIdx.x == 0) {
        end = list == nullptr ? 0 : ref.max_adjust;
    }
    __syncthreads();
    for (int j = threadIdx.x; list != nullptr && j < ref.max_adjust; j += ADJUST_THREADS) {
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

void launch(ggml_backend_cuda_context & ctx, const launch_rows & t) {
    cudaStream_t                stream     = ctx.stream();
    bool                        any_adjust = false;
    for (int r = 0; r < t.n_rows; ++r) {
        any_adjust = any_adjust || t.rows[r].adjust != nullptr;
    }
    ggml_cuda_pool_alloc<float> adjusted(ctx.pool());
    ggml_cuda_pool_alloc<int>   used(ctx.pool());
    if (any_adjust) {
        adjusted.alloc((size_t) t.n_rows * t.n);
        used.alloc(t.n_rows);
        adjust_rows<<<t.n_rows, ADJUST_THREADS, 0, stream>>>(t, adjusted.get(), used.get());
        CUDA_CHECK(cudaGetLastError());
    }
    sample_rows<<<t.n_rows * CLUSTER, THREADS, 0, stream>>>(t, adjusted.get(), used.get());
    CUDA_CHECK(cudaGetLastError());
}

// appends op's rows r0..r1-1 to t (which must have room for them)
void add_rows(launch_rows & t, const ggml_tensor * op, int64_t r0, int64_t r1) {
    const ggml_tensor * logits = op->src[0];
    const ggml_tensor * adjust = op->src[2];  // [4, max_adjust, rows] or null
    for (int64_t r = r0; r < r1; ++r) {
        row_ref & ref   = t.rows[t.n_rows++];
        ref.logits      = (const float *) ((const char *) logits->data + r * logits->nb[1]);
        ref.params      = (const pyqsa_sample_params *) op->src[1]->data + r;
        ref.adjust      = adjust == nullptr ? nullptr : (const pyqsa_logit_adjust *) adjust->data + r * adjust->ne[1];
        ref.max_adjust  = adjust == nullptr ? 0 : (int) adjust->ne[1];
        ref.out         = (pyqsa_sample_result *) op->data + r;
    }
}

bool is_sample_op(const ggml_tensor * t) {
    return t->op == GGML_OP_PYQSA && ggml_get_op_params_i32(t, 0) == PYQSA_GGML_OP_SAMPLE;
}

// whether op's result may be written while the ops of `run` read their inputs, and the reverse
bool independent(const ggml_tensor * op, const std::vector<const ggml_tensor *> & run) {
    for (const ggml_tensor * other : run) {
        for (int s = 0; s < 3; ++s) {
            if (pyqsa_cuda_bytes_overlap(op, other->src[s]) || pyqsa_cuda_bytes_overlap(other, op->src[s])) {
                return false;
            }
        }
    }
    return true;
}

}  // namespace

bool pyqsa_cuda_sample_supported(const ggml_tensor * op) {
    return ggml_is_contiguous(op->src[0]) && ggml_nrows(op->src[0]) <= 65535;
}

void pyqsa_cuda_sample(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const int64_t rows = dst->src[0]->ne[1];
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_LAUNCH_ROWS) {
        launch_rows t{};
        t.n = (int) dst->src[0]->ne[0];
        add_rows(t, dst, r0, std::min<int64_t>(rows, r0 + MAX_LAUNCH_ROWS));
        launch(ctx, t);
    }
}

int pyqsa_cuda_sample_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i) {
    std::vector<const ggml_tensor *> run;
    launch_rows                      t{};
    t.n      = (int) cgraph->nodes[i]->src[0]->ne[0];
    int last = i;
    for (int j = i; j < cgraph->n_nodes; ++j) {
        const ggml_tensor * node = cgraph->nodes[j];
        if (j > i && pyqsa_cuda_node_is_noop(node)) {
            continue;
        }
        if (!is_sample_op(node) || node->src[0]->ne[0] != t.n ||
            t.n_rows + node->src[0]->ne[1] > MAX_LAUNCH_ROWS || !independent(node, run)) {
            break;
        }
        run.push_back(node);
        add_rows(t, node, 0, node->src[0]->ne[1]);
        last = j;
    }
    if (run.size() < 2) {
        return 0;  // one op (or one too large for a launch) goes the usual way
    }
    launch(ctx, t);
    return last - i;
}
