// Host sampler of one logits row: the rules of pyqsa_sample_params (pyqsa.h). The CPU kernel of
// the sample op calls it per row, and pyqsa_sample exposes it to the engine's host path.
#include "pyqsa-ggml.h"
#include "sample-adjust.h"
#include "sample-params.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace {

// (logit desc, id asc): the order of top_k, top_p and the top log-probabilities
struct by_rank {
    const float * x;

    bool operator()(int32_t a, int32_t b) const { return x[a] > x[b] || (x[a] == x[b] && a < b); }
};

// the first m ids of `ids` in rank order (the rest in no order)
void rank_prefix(std::vector<int32_t> & ids, size_t m, const float * x) {
    m = std::min(m, ids.size());
    std::nth_element(ids.begin(), ids.begin() + (m - 1), ids.end(), by_rank{ x });
    std::sort(ids.begin(), ids.begin() + m, by_rank{ x });
}

// top_p: the shortest rank-order prefix of `cand` whose mass reaches top_p. The nucleus is
// almost always a few hundred ids, so rank a growing prefix until its mass is enough.
void cut_top_p(std::vector<int32_t> & cand, const float * x, double t, double y_max, float top_p) {
    double z = 0;
    for (int32_t id : cand) {
        z += std::exp((double) x[id] / t - y_max);
    }
    const double target = (double) top_p * z;
    for (size_t m = std::min<size_t>(256, cand.size());; m = std::min(m * 8, cand.size())) {
        rank_prefix(cand, m, x);
        double before = 0;  // the mass ranked before cand[i]
        for (size_t i = 0; i < m; ++i) {
            if (before >= target) {
                cand.resize(i);
                return;
            }
            before += std::exp((double) x[cand[i]] / t - y_max);
        }
        if (m == cand.size()) {
            return;
        }
    }
}

// u must exceed exp(-exp(-d)) for the noise -log(-log(u)) to exceed d >= 0; a lower bound of
// it from a table at steps of 1/64, one bin below d (past d = 40 no u below 1 - 2^-54 does)
double noise_bound(double d) {
    constexpr int STEPS = 64, BINS = 40 * STEPS;
    static const std::vector<double> table = [] {
        std::vector<double> v(BINS);
        for (int i = 0; i < BINS; ++i) {
            v[i] = std::exp(-std::exp(-(double) i / STEPS));
        }
        return v;
    }();
    const double bin = d * STEPS - 1;
    return bin < 0 ? 0.0 : bin >= BINS ? 1.0 : table[(size_t) bin];
}

// The largest logit, the lowest id on ties (0 when x[0] is NaN, as a scan with ">" gives): the
// maximum over four running maxima (independent, so they overlap), then the first id holding it.
// A greedy draw is only this; one running maximum kept a 150K row at 0.17 ms.
int32_t first_max(const float * x, int64_t n) {
    float   m[4] = { x[0], x[0], x[0], x[0] };
    int64_t i    = 1;
    for (; i + 4 <= n; i += 4) {
        for (int k = 0; k < 4; ++k) {
            m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
        }
    }
    for (; i < n; ++i) {
        m[0] = x[i] > m[0] ? x[i] : m[0];
    }
    for (int k = 1; k < 4; ++k) {
        m[0] = m[k] > m[0] ? m[k] : m[0];
    }
    for (int64_t j = 0; j < n; ++j) {
        if (x[j] == m[0]) {
            return (int32_t) j;
        }
    }
    return 0;
}

}  // namespace

void pyqsa_sample_row(const float * logits, int64_t n, const struct pyqsa_sample_params * params,
                      const struct pyqsa_logit_adjust * adjust, int64_t n_adjust, struct pyqsa_sample_result * out) {
    // an adjusted row is a copy: the logits may be a read-only view of the model's output
    thread_local std::vector<float> adjusted;
    const float *                   x = logits;
    if (n_adjust > 0 && adjust != nullptr && adjust[0].id >= 0) {
        adjusted.assign(logits, logits + n);
        for (int64_t j = 0; j < n_adjust && adjust[j].id >= 0; ++j) {
            if (adjust[j].id < n) {
                adjusted[adjust[j].id] = pyqsa_adjusted_logit(logits[adjust[j].id], adjust[j]);
            }
        }
        x = adjusted.data();
    }
    const pyqsa_sample_params checked = pyqsa_sample_params_checked(*params, n);
    const pyqsa_sample_params * p      = &checked;
    const int32_t best = first_max(x, n);
    std::fill(std::begin(out->top_ids), std::end(out->top_ids), -1);
    std::fill(std::begin(out->top_logprobs), std::end(out->top_logprobs), 0.0f);

    int32_t token = best;
    if (p->temperature > 0) {
        const double t     = p->temperature;
        const double y_max = (double) x[best] / t;
        std::vector<int32_t> cand(n);
        std::iota(cand.begin(), cand.end(), 0);
        if (p->top_k > 0) {
            rank_prefix(cand, (size_t) p->top_k, x);
            cand.resize(p->top_k);
        }
        if (p->min_p > 0) {
            const double min_p = p->min_p;
            cand.erase(std::remove_if(cand.begin(), cand.end(),
                                      [&](int32_t id) { return std::exp((double) x[id] / t - y_max) < min_p; }),
                       cand.end());
        }
        if (p->top_p < 1) {
            cut_top_p(cand, x, t, y_max, p->top_p);
        }
        // Gumbel-max: id beats the best score so far, top, only if its noise exceeds
        // d = top - y, i.e. u > exp(-exp(-d)). That bound, read from a table at the bin below d
        // (a lower bound: it grows with d), screens out almost every id before its logarithms;
        // the exact score decides for the rest.
        const uint64_t key = pyqsa_draw_key((uint64_t) p->seed_lo | ((uint64_t) p->seed_hi << 32), p->counter);
        double         top = y_max - std::log(-std::log(pyqsa_draw_uniform(key, best)));
        for (int32_t id : cand) {
            const double y = (double) x[id] / t;
            const double u = pyqsa_draw_uniform(key, id);
            if (y < top && u < noise_bound(top - y)) {
                continue;
            }
            const double score = y - std::log(-std::log(u));
            if (score > top || (score == top && id < token)) {
                top   = score;
                token = id;
            }
        }
    }
    out->token = token;

    if (p->n_top < 0) {
        out->logprob = NAN;
        return;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
        sum += std::exp((double) x[i] - (double) x[best]);
    }
    const double lse = (double) x[best] + std::log(sum);
    out->logprob     = (float) ((double) x[token] - lse);
    if (p->n_top > 0) {
        std::vector<int32_t> ids(n);
        std::iota(ids.begin(), ids.end(), 0);
        const int32_t n_top = std::min<int32_t>(p->n_top, (int32_t) n);
        rank_prefix(ids, (size_t) n_top, x);
        for (int32_t j = 0; j < n_top; ++j) {
            out->top_ids[j]      = ids[j];
            out->top_logprobs[j] = (float) ((double) x[ids[j]] - lse);
        }
    }
}
