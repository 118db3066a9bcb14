// Op checks of PYQSA_GGML_OP_SAMPLE: the CPU kernel against a brute-force reference of the rules
// (a full sort, every candidate's noise, logit adjustments applied to a copy first), then every
// other backend against the CPU: the same tokens and top ids, log-probabilities within 1e-5.
//   test-sample [test|perf] [-b BACKEND]
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "op-check.h"
#include "pyqsa-ggml.h"

#include "../ggml/sample-rng.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

// the rules of pyqsa_sample_params, written as plainly as possible
pyqsa_sample_result reference(const float * x, int n, const pyqsa_sample_params & p) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [x](int32_t a, int32_t b) { return x[a] > x[b]; });
    pyqsa_sample_result r{};
    r.token = order[0];
    if (p.temperature > 0) {
        const double         t = p.temperature, y_max = (double) x[order[0]] / t;
        std::vector<int32_t> cand;
        for (int i = 0; i < n; ++i) {
            const int32_t id = order[i];
            if (p.top_k > 0 && i >= p.top_k) break;
            if (p.min_p > 0 && std::exp((double) x[id] / t - y_max) < (double) p.min_p) continue;
            cand.push_back(id);
        }
        if (p.top_p < 1) {
            double z = 0, before = 0;
            for (int32_t id : cand) z += std::exp((double) x[id] / t - y_max);
            size_t keep = 0;
            for (; keep < cand.size() && before < (double) p.top_p * z; ++keep) {
                before += std::exp((double) x[cand[keep]] / t - y_max);
            }
            cand.resize(keep);
        }
        const uint64_t key  = pyqsa_draw_key((uint64_t) p.seed_lo | ((uint64_t) p.seed_hi << 32), p.counter);
        double         best = -INFINITY;
        for (int32_t id : cand) {
            const double s = (double) x[id] / t - std::log(-std::log(pyqsa_draw_uniform(key, id)));
            if (s > best || (s == best && id < r.token)) {
                best    = s;
                r.token = id;
            }
        }
    }
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp((double) x[i] - (double) x[order[0]]);
    const double lse = (double) x[order[0]] + std::log(sum);
    r.logprob        = p.n_top < 0 ? NAN : (float) ((double) x[r.token] - lse);
    for (int j = 0; j < 20; ++j) {
        const bool on     = j < p.n_top && j < n;
        r.top_ids[j]      = on ? order[j] : -1;
        r.top_logprobs[j] = on ? (float) ((double) x[order[j]] - lse) : 0.0f;
    }
    return r;
}

// rows are drawn from one of these: a trained model's peaked rows, the random demo model's
// flat ones, and rows of a few levels (many exact ties at every cut)
enum class row_kind { peaked, flat, levels };

struct sample_case {
    int                              n, rows;
    row_kind                         kind;
    std::vector<pyqsa_sample_params> params;          // cycled over the rows
    int                              max_adjust = 0;  // > 0: each row gets a list of adjustments
    // one one-row op per row, on views of the inputs, as llama.cpp's backend sampling builds a
    // step's draws (CUDA runs such a run of ops as one launch)
    bool                             split      = false;

    std::string name() const {
        const char * k = kind == row_kind::peaked ? "peaked" : kind == row_kind::flat ? "flat" : "levels";
        char         buf[128];
        std::snprintf(buf, sizeof(buf), "SAMPLE(n_vocab=%d,rows=%d,%s,max_adjust=%d%s)", n, rows, k, max_adjust,
                      split ? ",one op a row" : "");
        return buf;
    }
};

// the row as the draw sees it: the list's entries in order until the first negative id, each
// id below n set from its logit by bias, then the repetition penalty, then sub
std::vector<float> adjusted(const float * x, int n, const pyqsa_logit_adjust * list, int max_adjust) {
    std::vector<float> y(x, x + n);
    for (int j = 0; j < max_adjust && list[j].id >= 0; ++j) {
        const pyqsa_logit_adjust & a = list[j];
        if (a.id >= n) continue;
        float v = x[a.id] + a.bias;
        if (a.rep != 1.0f) v = v > 0.0f ? v / a.rep : v * a.rep;
        y[a.id] = v - a.sub;
    }
    return y;
}

// the sample op over c's rows on one backend (one op, or one op a row), inputs uploaded
struct sample_graph {
    ggml_context *             ctx = nullptr;
    ggml_cgraph *              gf  = nullptr;
    ggml_backend_buffer_t      buf = nullptr;
    std::vector<ggml_tensor *> outs;  // the rows' results in order, [42, rows] or [42, 1] each
    bool                       supported = false;

    sample_graph(ggml_backend_t be, const sample_case & c, const std::vector<float> & x,
                 const std::vector<pyqsa_sample_params> & p, const std::vector<pyqsa_logit_adjust> & adj) {
        ggml_init_params ip = { ggml_tensor_overhead() * (4 + 4 * c.rows) + ggml_graph_overhead(), nullptr, true };
        ctx                 = ggml_init(ip);
        ggml_tensor * lg    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n, c.rows);
        ggml_tensor * pa    = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 8, c.rows);
        ggml_tensor * ad    = c.max_adjust > 0 ? ggml_new_tensor_3d(ctx, GGML_TYPE_I32, 4, c.max_adjust, c.rows) : nullptr;
        if (!c.split) {
            outs.push_back(pyqsa_ggml_sample(ctx, lg, pa, ad));
        }
        for (int r = 0; c.split && r < c.rows; ++r) {
            ggml_tensor * row = ggml_view_2d(ctx, lg, c.n, 1, lg->nb[1], r * lg->nb[1]);
            ggml_tensor * pr  = ggml_view_2d(ctx, pa, 8, 1, pa->nb[1], r * pa->nb[1]);
            ggml_tensor * ar  = ad ? ggml_view_3d(ctx, ad, 4, c.max_adjust, 1, ad->nb[1], ad->nb[2], r * ad->nb[2]) : nullptr;
            outs.push_back(pyqsa_ggml_sample(ctx, row, pr, ar));
        }
        supported = true;
        for (ggml_tensor * out : outs) supported = supported && ggml_backend_supports_op(be, out);
        if (!supported) return;
        gf = ggml_new_graph(ctx);
        for (ggml_tensor * out : outs) ggml_build_forward_expand(gf, out);
        buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        ggml_backend_tensor_set(lg, x.data(), 0, ggml_nbytes(lg));
        ggml_backend_tensor_set(pa, p.data(), 0, ggml_nbytes(pa));
        if (ad) ggml_backend_tensor_set(ad, adj.data(), 0, ggml_nbytes(ad));
    }

    ~sample_graph() {
        if (buf) ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }

    void compute(ggml_backend_t be) const {
        if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
            std::fprintf(stderr, "compute failed\n");
            std::exit(2);
        }
    }
};

std::vector<pyqsa_sample_result> run(ggml_backend_t be, const sample_case & c, const std::vector<float> & x,
                                     const std::vector<pyqsa_sample_params> & p,
                                     const std::vector<pyqsa_logit_adjust> & adj, bool * supported) {
    const sample_graph g(be, c, x, p, adj);
    *supported = g.supported;
    std::vector<pyqsa_sample_result> res;
    if (g.supported) {
        g.compute(be);
        res.resize(c.rows);
        size_t row = 0;
        for (ggml_tensor * out : g.outs) {
            ggml_backend_tensor_get(out, res.data() + row, 0, ggml_nbytes(out));
            row += out->ne[1];
        }
    }
    return res;
}

// tokens and top ids equal, log-probabilities within tol (NaN where n_top is -1)
bool same(const pyqsa_sample_result & a, const pyqsa_sample_result & b, double tol, std::string & why) {
    bool ok = a.token == b.token && (std::isnan(a.logprob) ? std::isnan(b.logprob) : std::fabs(a.logprob - b.logprob) <= tol);
    for (int j = 0; j < 20; ++j) {
        ok = ok && a.top_ids[j] == b.top_ids[j] && std::fabs(a.top_logprobs[j] - b.top_logprobs[j]) <= tol;
    }
    if (!ok) why = "token " + std::to_string(a.token) + " vs " + std::to_string(b.token) + " ";
    return ok;
}

pyqsa_sample_params params(float t, int top_k, float top_p, float min_p, int n_top) {
    return { t, top_k, top_p, min_p, 0u, 0u, 0u, n_top };
}

std::vector<sample_case> cases() {
    const std::vector<pyqsa_sample_params> mix = {
        params(0, 0, 1, 0, -1),       params(1, 0, 1, 0, -1),      params(0.7f, 40, 1, 0, 5),
        params(0.9f, 0, 0.9f, 0, 20), params(0.8f, 0, 1, 0.05f, 0), params(1.2f, 200, 0.95f, 0, 3),
        params(1, 50, 0.9f, 0.02f, 1), params(0.3f, 1, 1, 0, -1),
    };
    return {
        { 151936, 16, row_kind::peaked, mix },
        { 151936, 16, row_kind::flat, mix },
        { 32000, 16, row_kind::levels, mix },
        { 5, 8, row_kind::levels, mix },
        { 1, 8, row_kind::flat, mix },
        { 151936, 16, row_kind::peaked, mix, 300 },
        { 32000, 16, row_kind::levels, mix, 40 },
        { 5, 8, row_kind::levels, mix, 3 },
        // one row: the op llama.cpp's backend sampling runs per sequence
        { 151936, 1, row_kind::levels, { params(1, 50, 0.9f, 0.02f, 1) } },
        { 151936, 1, row_kind::peaked, { params(0.9f, 0, 0.9f, 0, 20) } },
        // a step's draws as llama.cpp builds them: a one-row op per sequence, with and without
        // lists; more rows than one CUDA launch takes (32), so the run is split
        { 151936, 8, row_kind::peaked, mix, 1024, true },
        { 32000, 8, row_kind::levels, mix, 0, true },
        { 5, 40, row_kind::levels, mix, 3, true },
    };
}

// per row a list of distinct ids (a few past the vocabulary), biases that can lift an id to the
// top, repetition penalties (1 on some), subtractions; lists of every length up to max_adjust,
// some ended early by a -1 with entries past it that must change nothing
std::vector<pyqsa_logit_adjust> make_adjust(const sample_case & c, std::mt19937 & rng) {
    std::vector<pyqsa_logit_adjust> adj((size_t) c.max_adjust * c.rows);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    const float reps[] = { 1.0f, 1.3f, 0.8f, 2.0f };
    for (int r = 0; r < c.rows; ++r) {
        std::vector<int32_t> ids(c.n + 2);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        pyqsa_logit_adjust * list = adj.data() + (size_t) r * c.max_adjust;
        for (int j = 0; j < c.max_adjust; ++j) {
            list[j] = { ids[j % ids.size()], 12.0f * ud(rng) - 4.0f, reps[rng() % 4], 3.0f * ud(rng) };
        }
        const int len = (int) (rng() % (c.max_adjust + 1));
        if (len < c.max_adjust) list[len].id = -1;
    }
    return adj;
}

std::vector<float> make_rows(const sample_case & c, std::mt19937 & rng) {
    std::normal_distribution<float>       nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    std::vector<float>                    x((size_t) c.n * c.rows);
    for (auto & v : x) {
        v = c.kind == row_kind::peaked ? 3.0f * nd(rng) : c.kind == row_kind::flat ? ud(rng) : (float) (rng() % 6);
    }
    return x;
}

std::vector<pyqsa_sample_params> row_params(const sample_case & c, std::mt19937 & rng) {
    std::vector<pyqsa_sample_params> p(c.rows);
    for (int r = 0; r < c.rows; ++r) {
        p[r]         = c.params[r % c.params.size()];
        p[r].seed_lo = rng();
        p[r].seed_hi = rng();
        p[r].counter = rng() % 1000;
    }
    return p;
}

int cmd_test(const char * only_backend) {
    std::mt19937   rng(4321);
    int            n_ok = 0, n_fail = 0;
    ggml_backend_t cpu  = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, 4);
    for (const sample_case & c : cases()) {
        const std::vector<float>               x = make_rows(c, rng);
        const std::vector<pyqsa_sample_params> p   = row_params(c, rng);
        const std::vector<pyqsa_logit_adjust>  adj = make_adjust(c, rng);
        bool                                   supported = false;
        const auto                             out_cpu   = run(cpu, c, x, p, adj, &supported);
        bool                                   ok        = supported;
        std::string                            why;
        for (int r = 0; ok && r < c.rows; ++r) {
            const float * row = x.data() + (size_t) r * c.n;
            const auto    y   = adjusted(row, c.n, adj.data() + (size_t) r * c.max_adjust, c.max_adjust);
            ok = same(out_cpu[r], reference(y.data(), c.n, p[r]), 1e-6, why);
        }
        report(c.name(), "CPU", "vs reference: " + why, ok, n_ok, n_fail);
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            bool        sup = false;
            const auto  out = run(be, c, x, p, adj, &sup);
            bool        good = sup;
            std::string why2 = sup ? "vs CPU: " : "not supported ";
            for (int r = 0; good && r < c.rows; ++r) {
                good = same(out[r], out_cpu[r], 1e-5, why2);
            }
            return std::make_pair(good, why2);
        });
    }
    // parameters nobody set (llama.cpp runs an inactive sequence's sampler on a dummy row):
    // out-of-range values turn each setting off, so the row is drawn greedily, no log-probs
    sample_case bad{ 151936, 4, row_kind::peaked, { { NAN, -5, 7.0f, -1.0f, 1u, 2u, 3u, 99 },
                                                    { 1e-30f, 1 << 30, NAN, 3.0f, 0u, 0u, 0u, -7 },
                                                    { INFINITY, 0, -1.0f, NAN, 0u, 0u, 0u, 21 },
                                                    { -2.0f, 151936, 1.0f, 0.0f, 0u, 0u, 0u, -1 } } };
    const std::vector<float> xb      = make_rows(bad, rng);
    bool                     sup     = false;
    const auto               bad_cpu = run(cpu, bad, xb, bad.params, {}, &sup);
    bool                     ok      = sup;
    for (int r = 0; ok && r < bad.rows; ++r) {
        const float * row = xb.data() + (size_t) r * bad.n;
        ok = bad_cpu[r].token == (int32_t) (std::max_element(row, row + bad.n) - row) &&
             std::isnan(bad_cpu[r].logprob) && bad_cpu[r].top_ids[0] == -1;
    }
    report("SAMPLE(parameters out of range)", "CPU", "greedy, no log-probabilities: ", ok, n_ok, n_fail);
    on_other_backends(only_backend, "SAMPLE(parameters out of range)", n_ok, n_fail, [&](ggml_backend_t be) {
        bool        good = false;
        const auto  out  = run(be, bad, xb, bad.params, {}, &good);
        std::string why  = good ? "vs CPU: " : "not supported ";
        for (int r = 0; good && r < bad.rows; ++r) good = same(out[r], bad_cpu[r], 1e-5, why);
        return std::make_pair(good, why);
    });
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

// 8 rows of the Qwen vocabulary (a decode step of 8 requests) per parameter set, in one op and as
// the 8 one-row ops llama.cpp's backend sampling builds, and one row
int cmd_perf(const char * only_backend) {
    std::mt19937 rng(7);
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        ggml_backend_t be    = ggml_backend_dev_init(dev, nullptr);
        const int      iters = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? 5 : 200;
        struct perf_set { const char * label; pyqsa_sample_params p; int max_adjust; };
        const perf_set sets[] = {
            { "greedy", params(0, 0, 1, 0, -1), 0 },       { "temperature 1", params(1, 0, 1, 0, -1), 0 },
            { "top_p 0.9", params(1, 0, 0.9f, 0, -1), 0 }, { "top_k 40", params(1, 40, 1, 0, -1), 0 },
            { "logprobs 20", params(1, 0, 1, 0, 20), 0 },  { "temperature 1, 1024 adjustments", params(1, 0, 1, 0, -1), 1024 },
        };
        for (const auto & [rows, split] : { std::pair{ 8, false }, std::pair{ 8, true }, std::pair{ 1, false } }) {
            for (const auto & [label, set, max_adjust] : sets) {
                sample_case c{ 151936, rows, row_kind::peaked, { set }, max_adjust, split };
                const std::vector<float> x = make_rows(c, rng);
                const sample_graph       g(be, c, x, row_params(c, rng), make_adjust(c, rng));
                if (!g.supported) continue;
                const double us = time_graph(be, g.gf, iters);
                std::printf("  SAMPLE(%d x 151936%s, %s) %s: %.1f us/step (the op alone, logits on the backend)\n",
                            rows, split ? " in one-row ops" : "", label, ggml_backend_dev_name(dev), us);
            }
        }
        ggml_backend_free(be);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv, { { "test", cmd_test }, { "perf", cmd_perf } });
}
