// Checks every pyqsa ggml op in the style of upstream's test-backend-ops: each case runs on the
// CPU backend against a double-precision reference written here, then on every other backend
// against the CPU result. `perf` mode times the decode shapes instead.
//
//   test-qsa-ops [test|perf] [-b BACKEND]      exit code 0 when every case passed
#include "op-check.h"
#include "pyqsa-ggml.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

struct attn_case {
    ggml_type type;
    int64_t   D, H, Hkv, n_q, ns, n_kv, n_sel;
    double    unused_frac;  // share of -1 slots in the cell lists
    bool      empty_row;    // one query with no cell at all
    bool      q_view = false;  // q a strided view (the even head slots of a tensor twice as wide), as the graph passes it

    std::string name() const {
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "QSA_ATTN(type=%s,D=%lld,H=%lld,Hkv=%lld,n_q=%lld,ns=%lld,n_kv=%lld,n_sel=%lld,unused=%.2f%s%s)",
                      ggml_type_name(type), (long long) D, (long long) H, (long long) Hkv, (long long) n_q,
                      (long long) ns, (long long) n_kv, (long long) n_sel, unused_frac, empty_row ? ",empty" : "",
                      q_view ? ",q_view" : "");
        return buf;
    }
};

// host data of one case; k/v kept both encoded (as uploaded) and decoded (for the reference)
struct attn_data {
    std::vector<float>   q, k, v;        // f32, k/v already round-tripped through the type
    std::vector<uint8_t> k_raw, v_raw;   // encoded as c.type
    std::vector<int32_t> cells;
};

std::vector<uint8_t> encode(ggml_type type, std::vector<float> & x, int64_t row) {
    const int64_t n_rows = (int64_t) x.size() / row;
    std::vector<uint8_t> raw(ggml_row_size(type, row) * n_rows);
    if (type == GGML_TYPE_F32) {
        std::memcpy(raw.data(), x.data(), raw.size());
    } else if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(x.data(), (ggml_fp16_t *) raw.data(), (int64_t) x.size());
    } else {
        ggml_quantize_chunk(type, x.data(), raw.data(), 0, n_rows, row, nullptr);
    }
    // what the kernels will actually see
    if (type == GGML_TYPE_F16) {
        ggml_fp16_to_fp32_row((const ggml_fp16_t *) raw.data(), x.data(), (int64_t) x.size());
    } else if (type != GGML_TYPE_F32) {
        ggml_get_type_traits(type)->to_float(raw.data(), x.data(), (int64_t) x.size());
    }
    return raw;
}

attn_data make_data(const attn_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    attn_data d;
    d.q.resize(c.D * c.H * c.n_q * c.ns);
    d.k.resize(c.D * c.Hkv * c.n_kv * c.ns);
    d.v.resize(d.k.size());
    for (auto & x : d.q) x = nd(rng);
    for (auto & x : d.k) x = nd(rng);
    for (auto & x : d.v) x = nd(rng);
    d.k_raw = encode(c.type, d.k, c.D);
    d.v_raw = encode(c.type, d.v, c.D);

    d.cells.assign(c.n_sel * c.n_q * c.ns, -1);
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (int64_t s = 0; s < c.ns; ++s) {
        for (int64_t iq = 0; iq < c.n_q; ++iq) {
            if (c.empty_row && iq == c.n_q - 1) {
                continue;
            }
            // distinct cells: a random sample of the cache, in random order
            std::vector<int32_t> pool(c.n_kv);
            for (int64_t i = 0; i < c.n_kv; ++i) pool[i] = (int32_t) i;
            const int64_t take = std::min(c.n_sel, c.n_kv);
            for (int64_t i = 0; i < take; ++i) {
                std::swap(pool[i], pool[i + rng() % (c.n_kv - i)]);
            }
            int32_t * row = d.cells.data() + (s * c.n_q + iq) * c.n_sel;
            for (int64_t i = 0; i < take; ++i) {
                row[i] = ud(rng) < c.unused_frac ? -1 : pool[i];
            }
        }
    }
    return d;
}

std::vector<float> reference(const attn_case & c, const attn_data & d, float scale) {
    std::vector<float> out(c.D * c.H * c.n_q * c.ns, 0.0f);
    const int64_t group = c.H / c.Hkv;
    std::vector<double> acc(c.D);
    for (int64_t s = 0; s < c.ns; ++s)
    for (int64_t iq = 0; iq < c.n_q; ++iq)
    for (int64_t h = 0; h < c.H; ++h) {
        const float *   q    = d.q.data() + ((s * c.n_q + iq) * c.H + h) * c.D;
        const int32_t * row  = d.cells.data() + (s * c.n_q + iq) * c.n_sel;
        const int64_t   hk   = h / group;
        std::vector<double> scores;
        std::vector<int32_t> used;
        for (int64_t j = 0; j < c.n_sel; ++j) {
            if (row[j] < 0) continue;
            const float * k = d.k.data() + ((s * c.n_kv + row[j]) * c.Hkv + hk) * c.D;
            double dot = 0.0;
            for (int64_t e = 0; e < c.D; ++e) dot += (double) q[e] * k[e];
            scores.push_back(dot * scale);
            used.push_back(row[j]);
        }
        if (used.empty()) continue;
        double m = -INFINITY;
        for (double x : scores) m = std::max(m, x);
        double l = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (size_t j = 0; j < used.size(); ++j) {
            const double w = std::exp(scores[j] - m);
            const float * v = d.v.data() + ((s * c.n_kv + used[j]) * c.Hkv + hk) * c.D;
            for (int64_t e = 0; e < c.D; ++e) acc[e] += w * v[e];
            l += w;
        }
        float * o = out.data() + ((s * c.n_q + iq) * c.H + h) * c.D;
        for (int64_t e = 0; e < c.D; ++e) o[e] = (float) (acc[e] / l);
    }
    return out;
}

// builds the case on backend; returns false when the backend does not support it
bool build(graph_run & g, ggml_backend_t backend, const attn_case & c, const attn_data & d, float scale) {
    ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
    g.ctx = ggml_init(ip);
    const int64_t wide  = c.q_view ? 2 : 1;
    ggml_tensor * q_all = ggml_new_tensor_4d(g.ctx, GGML_TYPE_F32, c.D, wide * c.H, c.n_q, c.ns);
    ggml_tensor * q     = ggml_view_4d(g.ctx, q_all, c.D, c.H, c.n_q, c.ns, wide * q_all->nb[1], q_all->nb[2],
                                       q_all->nb[3], 0);
    ggml_tensor * k     = ggml_new_tensor_4d(g.ctx, c.type, c.D, c.Hkv, c.n_kv, c.ns);
    ggml_tensor * v     = ggml_new_tensor_4d(g.ctx, c.type, c.D, c.Hkv, c.n_kv, c.ns);
    ggml_tensor * cells = ggml_new_tensor_3d(g.ctx, GGML_TYPE_I32, c.n_sel, c.n_q, c.ns);
    g.out = pyqsa_ggml_qsa_attn(g.ctx, q, k, v, cells, scale);
    if (!ggml_backend_supports_op(backend, g.out)) {
        return false;
    }
    g.gf = ggml_new_graph(g.ctx);
    ggml_build_forward_expand(g.gf, g.out);
    g.buf = ggml_backend_alloc_ctx_tensors(g.ctx, backend);
    std::vector<float> q_host(ggml_nelements(q_all), NAN);  // the odd slots must not be read
    for (int64_t row = 0; row < c.H * c.n_q * c.ns; ++row) {
        std::copy(d.q.begin() + row * c.D, d.q.begin() + (row + 1) * c.D, q_host.begin() + wide * row * c.D);
    }
    ggml_backend_tensor_set(q_all, q_host.data(), 0, ggml_nbytes(q_all));
    ggml_backend_tensor_set(k, d.k_raw.data(), 0, ggml_nbytes(k));
    ggml_backend_tensor_set(v, d.v_raw.data(), 0, ggml_nbytes(v));
    ggml_backend_tensor_set(cells, d.cells.data(), 0, ggml_nbytes(cells));
    return true;
}

std::vector<float> run(ggml_backend_t backend, const attn_case & c, const attn_data & d, float scale, bool * supported) {
    graph_run g;
    *supported = build(g, backend, c, d, scale);
    if (!*supported) return {};
    if (ggml_backend_graph_compute(backend, g.gf) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "compute failed\n");
        std::exit(2);
    }
    std::vector<float> out(ggml_nelements(g.out));
    ggml_backend_tensor_get(g.out, out.data(), 0, ggml_nbytes(g.out));
    return out;
}

std::vector<attn_case> test_cases() {
    std::vector<attn_case> cases;
    const ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0 };
    for (ggml_type t : types) {
        // GQA ratios and head dims of the QSA models (Flash-Next: 24 q / 2 kv heads x 256)
        cases.push_back({ t, 256, 24, 2, 1, 1, 2100, 2051, 0.0, false });
        cases.push_back({ t, 256, 24, 2, 3, 2, 300, 64, 0.1, true });
        cases.push_back({ t, 128, 4, 1, 17, 1, 300, 19, 0.2, false });
        cases.push_back({ t, 64, 8, 8, 5, 2, 7, 12, 0.3, false });
        cases.push_back({ t, 512, 2, 1, 2, 1, 40, 40, 0.0, true });
        cases.push_back({ t, 64, 4, 2, 1, 1, 1, 1, 0.0, false });
    }
    // prefill-sized f16 calls (CUDA: the tensor-core kernel): several splits with -1 entries and an
    // empty row, a 16-head group over two streams, one head a group at D 64, one split at D 256
    cases.push_back({ GGML_TYPE_F16, 256, 24, 2, 40, 1, 3000, 2051, 0.1, true });
    cases.push_back({ GGML_TYPE_F16, 128, 16, 1, 20, 2, 500, 77, 0.3, false });
    cases.push_back({ GGML_TYPE_F16, 64, 8, 8, 16, 1, 100, 33, 0.0, false });
    cases.push_back({ GGML_TYPE_F16, 256, 12, 1, 180, 1, 1000, 515, 0.05, false });
    // long contexts: the list, not the cache, sets the cost
    cases.push_back({ GGML_TYPE_F16, 128, 4, 1, 1, 1, 262144, 2051, 0.0, false });
    cases.push_back({ GGML_TYPE_Q8_0, 256, 12, 1, 2, 1, 65536, 515, 0.05, false });
    // q read through its strides, as the graph passes it (no copy): a prefill chunk (tensor
    // cores on CUDA) and decode-sized rows over two streams
    cases.push_back({ GGML_TYPE_F16, 256, 24, 2, 40, 1, 3000, 2051, 0.1, true, true });
    cases.push_back({ GGML_TYPE_F32, 128, 4, 1, 3, 2, 300, 19, 0.2, false, true });
    return cases;
}

void test_mask_cells(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail);
void test_topk(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail);
void test_block_cells(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail);
void test_score(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail);

int cmd_test(const char * only_backend) {
    std::mt19937 rng(1234);
    int n_ok = 0, n_fail = 0;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, 4);
    for (const attn_case & c : test_cases()) {
        const float scale = 1.0f / std::sqrt((float) c.D);
        const attn_data d = make_data(c, rng);
        const std::vector<float> ref = reference(c, d, scale);
        bool supported = false;
        const std::vector<float> out_cpu = run(cpu, c, d, scale, &supported);
        const double e_cpu = nmse(out_cpu, ref);
        report(c.name(), "CPU", "vs reference: nmse " + sci(e_cpu) + " ", supported && e_cpu < 1e-9, n_ok, n_fail);
        const auto check = [&](ggml_backend_t be) {
            bool ok = false;
            const std::vector<float> out = run(be, c, d, scale, &ok);
            const double e = ok ? nmse(out, out_cpu) : INFINITY;
            return std::make_pair(ok && e < 1e-9, std::string(ok ? "vs CPU: nmse " + sci(e) + " " : "not supported "));
        };
        on_other_backends(only_backend, c.name(), n_ok, n_fail, check);
        if (c.type == GGML_TYPE_F16) {
            // the same call on CUDA's CUDA-core kernel (a fresh backend: no graph kept from above)
            setenv("PYQSA_QSA_ATTN_MMA", "0", 1);
            on_other_backends(only_backend, c.name() + " PYQSA_QSA_ATTN_MMA=0", n_ok, n_fail, check);
            unsetenv("PYQSA_QSA_ATTN_MMA");
        }
    }
    test_mask_cells(cpu, only_backend, rng, n_ok, n_fail);
    test_topk(cpu, only_backend, rng, n_ok, n_fail);
    test_block_cells(cpu, only_backend, rng, n_ok, n_fail);
    test_score(cpu, only_backend, rng, n_ok, n_fail);
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

struct mask_case {
    ggml_type type;
    int64_t   n_kv, n_tps, ns, n_sel;
    double    keep;  // share of finite entries

    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "QSA_MASK_CELLS(type=%s,n_kv=%lld,n_tps=%lld,ns=%lld,n_sel=%lld,keep=%.3f)",
                      ggml_type_name(type), (long long) n_kv, (long long) n_tps, (long long) ns, (long long) n_sel, keep);
        return buf;
    }
};


std::vector<int32_t> run_mask(ggml_backend_t backend, const mask_case & c, const std::vector<float> & mask, bool * supported) {
    const auto make = [&](ggml_context * ctx) {
        ggml_tensor * m = ggml_new_tensor_4d(ctx, c.type, c.n_kv, c.n_tps, 1, c.ns);
        return std::make_pair(m, pyqsa_ggml_qsa_mask_cells(ctx, m, c.n_sel));
    };
    const auto upload = [&](ggml_tensor * m) {
        if (c.type == GGML_TYPE_F32) {
            ggml_backend_tensor_set(m, mask.data(), 0, ggml_nbytes(m));
        } else {
            std::vector<ggml_fp16_t> h(mask.size());
            ggml_fp32_to_fp16_row(mask.data(), h.data(), (int64_t) mask.size());
            ggml_backend_tensor_set(m, h.data(), 0, ggml_nbytes(m));
        }
    };
    return run_op<int32_t>(backend, make, upload, supported);
}

void test_mask_cells(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail) {
    const mask_case cases[] = {
        { GGML_TYPE_F32, 300, 5, 2, 19, 0.05 },
        { GGML_TYPE_F16, 300, 5, 2, 19, 0.05 },
        { GGML_TYPE_F32, 2100, 3, 1, 64, 0.5 },      // more finite entries than slots: truncated
        { GGML_TYPE_F16, 1, 1, 1, 1, 1.0 },
        { GGML_TYPE_F32, 262144, 1, 2, 2051, 0.007 },
        { GGML_TYPE_F16, 65536, 4, 1, 2051, 0.0 },   // nothing visible
    };
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (const mask_case & c : cases) {
        std::vector<float> mask(c.n_kv * c.n_tps * c.ns);
        for (auto & x : mask) x = ud(rng) < c.keep ? 0.0f : -INFINITY;
        std::vector<int32_t> ref(c.n_sel * c.n_tps * c.ns, -1);
        for (int64_t row = 0; row < c.n_tps * c.ns; ++row) {
            int64_t n = 0;
            for (int64_t j = 0; j < c.n_kv && n < c.n_sel; ++j) {
                if (mask[row * c.n_kv + j] == 0.0f) ref[row * c.n_sel + n++] = (int32_t) j;
            }
        }
        bool supported = false;
        const std::vector<int32_t> out_cpu = run_mask(cpu, c, mask, &supported);
        report(c.name(), "CPU", "vs reference: ", supported && out_cpu == ref, n_ok, n_fail);
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            bool ok = false;
            const std::vector<int32_t> out = run_mask(be, c, mask, &ok);
            return std::make_pair(ok && out == out_cpu, std::string("vs CPU: "));
        });
    }
}

struct topk_case {
    int64_t n, rows, k;
    int     levels;  // scores drawn from this many values (few levels = many exact ties); 0 = continuous
    double  neg_inf; // share of -inf scores
    bool    vis;     // per-row candidate counts (n_vis)

    std::string name() const {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "QSA_TOPK(n=%lld,rows=%lld,k=%lld,levels=%d,neg_inf=%.2f%s)",
                      (long long) n, (long long) rows, (long long) k, levels, neg_inf, vis ? ",n_vis" : "");
        return buf;
    }
};

std::vector<int32_t> run_topk(ggml_backend_t backend, const topk_case & c, const std::vector<float> & x,
                              const std::vector<int32_t> & vis, bool * supported) {
    ggml_tensor * v = nullptr;
    const auto make = [&](ggml_context * ctx) {
        ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n, c.rows);
        v = c.vis ? ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.rows) : nullptr;
        return std::make_pair(t, pyqsa_ggml_qsa_topk(ctx, t, v, c.k));
    };
    const auto upload = [&](ggml_tensor * t) {
        ggml_backend_tensor_set(t, x.data(), 0, ggml_nbytes(t));
        if (v) ggml_backend_tensor_set(v, vis.data(), 0, ggml_nbytes(v));
    };
    return run_op<int32_t>(backend, make, upload, supported);
}

void test_topk(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail) {
    const topk_case cases[] = {
        { 7, 3, 4, 3, 0.0, false },          // the tiny models' shape: few blocks, exact zero ties
        { 75, 5, 4, 4, 0.3, false },
        { 512, 4, 512, 0, 0.0, false },      // k == n
        { 65536, 2, 512, 0, 0.0, false },    // 256K context, budget 2048, ratio 4
        { 65536, 2, 512, 5, 0.5, false },
        { 33000, 3, 517, 2, 0.9, false },    // fewer finite scores than k
        { 1, 1, 1, 0, 1.0, false },
        { 80, 40, 4, 3, 0.0, true },         // a prefill chunk: each query sees its own prefix
        { 65536, 3, 512, 0, 0.0, true },
        { 65536, 8, 512, 0, 0.0, false },    // decode steps of 8 and 1 sequences at 256K
        { 65536, 1, 512, 3, 0.0, true },
        // CUDA: rows the compact kernel leaves to the general one (too many keys in the k-th
        // key's bin, or k over 1024), and a tie cut among a bin's candidates
        { 65536, 2, 512, 1, 0.0, false },    // all equal
        { 40000, 2, 512, 0, 0.99, false },   // the k-th key is -inf
        { 5000, 3, 1500, 0, 0.0, false },
        { 20000, 4, 512, 3, 0.0, false },
    };
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (const topk_case & c : cases) {
        std::vector<float> x(c.n * c.rows);
        for (auto & v : x) {
            v = ud(rng) < c.neg_inf ? -INFINITY : (c.levels ? (float) (rng() % c.levels) : nd(rng));
        }
        std::vector<int32_t> vis(c.rows);
        for (auto & v : vis) v = (int32_t) (rng() % (c.n + 1));
        // reference: sort indices by (score desc, index asc), keep k, list them by index
        std::vector<int32_t> ref;
        for (int64_t r = 0; r < c.rows; ++r) {
            std::vector<float> masked(x.begin() + r * c.n, x.begin() + (r + 1) * c.n);
            if (c.vis) std::fill(masked.begin() + vis[r], masked.end(), -INFINITY);
            const float * row = masked.data();
            std::vector<int32_t> idx(c.n);
            for (int64_t i = 0; i < c.n; ++i) idx[i] = (int32_t) i;
            std::stable_sort(idx.begin(), idx.end(), [row](int32_t a, int32_t b) { return row[a] > row[b]; });
            idx.resize(c.k);
            std::sort(idx.begin(), idx.end());
            ref.insert(ref.end(), idx.begin(), idx.end());
        }
        bool supported = false;
        const std::vector<int32_t> out_cpu = run_topk(cpu, c, x, vis, &supported);
        report(c.name(), "CPU", "vs reference: ", supported && out_cpu == ref, n_ok, n_fail);
        // CUDA: rows of 32768 keys or more at decode sizes on a cluster of CTAs a row, then every
        // row on one CTA (PYQSA_CUDA_TOPK_ONE_CTA=1). Each run's graph is new to the backend or
        // captured anew, never a replay, so the second run takes the switch.
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            bool ok = false, ok_one = false;
            const std::vector<int32_t> out = run_topk(be, c, x, vis, &ok);
            setenv("PYQSA_CUDA_TOPK_ONE_CTA", "1", 1);
            const std::vector<int32_t> out_one = run_topk(be, c, x, vis, &ok_one);
            unsetenv("PYQSA_CUDA_TOPK_ONE_CTA");
            return std::make_pair(ok && ok_one && out == out_cpu && out_one == out_cpu,
                                  std::string("vs CPU (and with PYQSA_CUDA_TOPK_ONE_CTA=1): "));
        });
    }
}

void test_block_cells(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail) {
    // hot > 0: the paged variant, with `hot` block slots and a ring of `ring` cells
    struct bc_case { int64_t kb, n_q, ns; int32_t r; int32_t max_pos; int32_t hot, ring; };
    const bc_case cases[] = {
        { 4, 5, 2, 4, 80, 0, 0 },      { 512, 3, 2, 4, 262143, 0, 0 }, { 2, 7, 1, 1, 30, 0, 0 },
        { 8, 1, 1, 16, 5, 0, 0 },      { 4, 5, 2, 4, 80, 12, 9 },      { 512, 3, 2, 4, 262143, 1024, 515 },
        { 2, 7, 1, 1, 30, 3, 4 },
    };
    for (const bc_case & c : cases) {
        char name[160];
        std::snprintf(name, sizeof(name), "QSA_BLOCK_CELLS(kb=%lld,n_q=%lld,ns=%lld,r=%d%s)", (long long) c.kb,
                      (long long) c.n_q, (long long) c.ns, c.r,
                      c.hot ? (",paged,hot=" + std::to_string(c.hot) + ",ring=" + std::to_string(c.ring)).c_str() : "");
        const bool    paged = c.hot > 0;
        const int64_t rows = c.n_q * c.ns, n_out = c.kb * c.r + c.r - 1;
        std::vector<int32_t> pos(rows), vis(rows), blocks(c.kb * rows), slots(c.kb * rows), n_paged(rows, 0);
        for (int64_t i = 0; i < rows; ++i) {
            pos[i] = (int32_t) (rng() % (c.max_pos + 1));
            vis[i] = (pos[i] + 1) / c.r;
            if (paged) {
                // the ring must reach back to the first cell not in the host store
                const int32_t lo = std::max(0, (pos[i] + 1 - c.ring + c.r - 1) / c.r);
                n_paged[i] = lo + (int32_t) (rng() % (vis[i] - std::min(lo, vis[i]) + 1));
            }
            // increasing block ids, some past n_vis (as top-k returns when few blocks are visible)
            int32_t b = 0;
            for (int64_t j = 0; j < c.kb; ++j) {
                b += 1 + (int32_t) (rng() % 3);
                blocks[i * c.kb + j] = b - 1;
                slots[i * c.kb + j]  = paged ? (int32_t) (rng() % c.hot) : 0;
            }
        }
        const auto row_of = [&](int32_t cell) { return paged ? c.hot * c.r + cell % c.ring : cell; };
        std::vector<int32_t> ref(n_out * rows, -1);
        for (int64_t i = 0; i < rows; ++i) {
            for (int64_t j = 0; j < c.kb * c.r; ++j) {
                const int32_t blk = blocks[i * c.kb + j / c.r], t = (int32_t) (j % c.r);
                if (blk >= vis[i]) continue;
                ref[i * n_out + j] = blk < n_paged[i] ? slots[i * c.kb + j / c.r] * c.r + t : row_of(blk * c.r + t);
            }
            for (int32_t t = 0; vis[i] * c.r + t <= pos[i]; ++t) ref[i * n_out + c.kb * c.r + t] = row_of(vis[i] * c.r + t);
        }
        ggml_tensor * tv = nullptr;
        ggml_tensor * tp = nullptr;
        ggml_tensor * ts = nullptr;
        ggml_tensor * tn = nullptr;
        const auto make = [&](ggml_context * ctx) {
            ggml_tensor * tb = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, c.kb, c.n_q, c.ns);
            tv = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, rows);
            tp = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, rows);
            if (!paged) return std::make_pair(tb, pyqsa_ggml_qsa_block_cells(ctx, tb, tv, tp, c.r));
            ts = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, c.kb, c.n_q, c.ns);
            tn = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, rows);
            return std::make_pair(tb, pyqsa_ggml_qsa_block_cells_paged(ctx, tb, ts, tv, tn, tp, c.r, c.hot * c.r, c.ring));
        };
        const auto upload = [&](ggml_tensor * tb) {
            ggml_backend_tensor_set(tb, blocks.data(), 0, ggml_nbytes(tb));
            ggml_backend_tensor_set(tv, vis.data(), 0, ggml_nbytes(tv));
            ggml_backend_tensor_set(tp, pos.data(), 0, ggml_nbytes(tp));
            if (paged) {
                ggml_backend_tensor_set(ts, slots.data(), 0, ggml_nbytes(ts));
                ggml_backend_tensor_set(tn, n_paged.data(), 0, ggml_nbytes(tn));
            }
        };
        bool supported = false;
        const std::vector<int32_t> out_cpu = run_op<int32_t>(cpu, make, upload, &supported);
        report(name, "CPU", "vs reference: ", supported && out_cpu == ref, n_ok, n_fail);
        on_other_backends(only_backend, name, n_ok, n_fail, [&](ggml_backend_t be) {
            bool ok = false;
            const std::vector<int32_t> out = run_op<int32_t>(be, make, upload, &ok);
            return std::make_pair(ok && out == out_cpu, std::string("vs CPU: "));
        });
    }
}

struct score_case {
    int64_t D, n_head, n_tps, ns, n_blocks;
    bool    q_view;  // q a strided view (every other row of a larger tensor), as in the graph
    int     dup;     // blocks that repeat block 0's key: their scores must tie exactly

    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "QSA_SCORE(D=%lld,n_head=%lld,n_tps=%lld,ns=%lld,n_blocks=%lld%s,dup=%d)",
                      (long long) D, (long long) n_head, (long long) n_tps, (long long) ns, (long long) n_blocks,
                      q_view ? ",q_view" : "", dup);
        return buf;
    }
};

std::vector<float> run_score(ggml_backend_t backend, const score_case & c, const std::vector<float> & q,
                             const std::vector<float> & keys, float scale, bool * supported) {
    // with q_view, q's rows sit in the even head slots of a tensor twice as wide
    const int64_t wide = c.q_view ? 2 : 1;
    ggml_tensor * k    = nullptr;
    const auto make = [&](ggml_context * ctx) {
        ggml_tensor * q_all = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.D, wide * c.n_head, c.n_tps, c.ns);
        ggml_tensor * qv    = ggml_view_4d(ctx, q_all, c.D, c.n_head, c.n_tps, c.ns, wide * q_all->nb[1],
                                           q_all->nb[2], q_all->nb[3], 0);
        k = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.D, c.n_blocks, c.ns);
        return std::make_pair(q_all, pyqsa_ggml_qsa_score(ctx, qv, k, scale));
    };
    const auto upload = [&](ggml_tensor * q_all) {
        std::vector<float> q_host(ggml_nelements(q_all), NAN);  // the odd slots must not be read
        for (int64_t row = 0; row < c.n_head * c.n_tps * c.ns; ++row) {
            std::copy(q.begin() + row * c.D, q.begin() + (row + 1) * c.D, q_host.begin() + wide * row * c.D);
        }
        ggml_backend_tensor_set(q_all, q_host.data(), 0, ggml_nbytes(q_all));
        ggml_backend_tensor_set(k, keys.data(), 0, ggml_nbytes(k));
    };
    return run_op<float>(backend, make, upload, supported);
}

// the duplicated blocks' scores equal block 0's, bit for bit, in every row
bool ties_exact(const score_case & c, const std::vector<float> & out) {
    for (int64_t row = 0; row < c.n_tps * c.ns; ++row) {
        for (int j = 1; j <= c.dup; ++j) {
            const int64_t b = j * c.n_blocks / (c.dup + 1);
            if (std::memcmp(&out[row * c.n_blocks + b], &out[row * c.n_blocks], sizeof(float)) != 0) return false;
        }
    }
    return true;
}

void test_score(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail) {
    const score_case cases[] = {
        { 128, 4, 1, 1, 65536, true, 3 },   // Flash-Next indexer, 256K context, ratio 4: one decode query
        { 128, 4, 1, 8, 8192, true, 2 },    // 8 sequences decoding at 32K
        { 128, 4, 5, 2, 300, false, 1 },    // a few queries per stream
        { 64, 1, 3, 1, 7, false, 0 },
        { 256, 2, 2, 3, 1, true, 0 },       // one block
        { 512, 3, 1, 1, 100, false, 1 },
        { 32, 16, 16, 1, 1000, false, 4 },
        // prefill chunks: more than 16 queries per stream (CUDA: the tensor-core kernel), with
        // partial query and block tiles
        { 128, 4, 37, 1, 1000, true, 3 },   // Flash-Next indexer
        { 128, 4, 100, 2, 2051, false, 2 },
        { 32, 2, 64, 1, 517, true, 1 },     // the tiny models' indexer
        { 64, 1, 17, 3, 129, false, 1 },
        { 128, 8, 33, 1, 700, false, 1 },
        { 256, 8, 20, 1, 50, false, 1 },    // no tensor-core variant: CUDA's decode kernel
    };
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const score_case & c : cases) {
        const float scale = 1.0f / std::sqrt((float) c.D);
        std::vector<float> q(c.D * c.n_head * c.n_tps * c.ns), keys(c.D * c.n_blocks * c.ns);
        for (auto & x : q) x = nd(rng);
        for (auto & x : keys) x = nd(rng);
        for (int64_t s = 0; s < c.ns; ++s) {
            const float * k0 = keys.data() + s * c.n_blocks * c.D;
            for (int j = 1; j <= c.dup; ++j) {
                std::copy(k0, k0 + c.D, keys.begin() + (s * c.n_blocks + j * c.n_blocks / (c.dup + 1)) * c.D);
            }
        }
        std::vector<float> ref(c.n_blocks * c.n_tps * c.ns);
        for (int64_t s = 0; s < c.ns; ++s)
        for (int64_t t = 0; t < c.n_tps; ++t)
        for (int64_t b = 0; b < c.n_blocks; ++b) {
            double acc = 0.0;
            for (int64_t h = 0; h < c.n_head; ++h) {
                const float * qr = q.data() + ((s * c.n_tps + t) * c.n_head + h) * c.D;
                const float * kr = keys.data() + (s * c.n_blocks + b) * c.D;
                double dot = 0.0;
                for (int64_t e = 0; e < c.D; ++e) dot += (double) qr[e] * kr[e];
                acc += std::max(dot, 0.0);
            }
            ref[(s * c.n_tps + t) * c.n_blocks + b] = (float) (acc * scale);
        }
        // f32 sums of D products: relative error ~1e-7 of each row's magnitude
        bool supported = false;
        const std::vector<float> out_cpu = run_score(cpu, c, q, keys, scale, &supported);
        const double e_cpu = supported ? nmse(out_cpu, ref) : INFINITY;
        report(c.name(), "CPU", "vs reference: nmse " + sci(e_cpu) + ", ties exact ",
               supported && e_cpu < 1e-11 && ties_exact(c, out_cpu), n_ok, n_fail);
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            bool ok = false;
            const std::vector<float> out = run_score(be, c, q, keys, scale, &ok);
            const double e = ok ? nmse(out, out_cpu) : INFINITY;
            return std::make_pair(ok && e < 1e-11 && ties_exact(c, out),
                                  std::string(ok ? "vs CPU: nmse " + sci(e) + ", ties exact " : "not supported "));
        });
    }
}

// A decode step's top-k (k = 512) over `rows` rows of n block scores, timed as it runs and with
// every row on one CTA (PYQSA_CUDA_TOPK_ONE_CTA=1), a backend each: CUDA would replay the graph
// it captured the way before
void perf_topk(ggml_backend_dev_t dev, int64_t n, int64_t rows) {
    std::vector<float> v(n * rows);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::mt19937 rng(5);
    for (auto & e : v) e = nd(rng);
    for (const char * one : { "", "1" }) {
        if (*one) setenv("PYQSA_CUDA_TOPK_ONE_CTA", one, 1);
        ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
        graph_run g;
        ggml_init_params ip = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true };
        g.ctx               = ggml_init(ip);
        ggml_tensor * x     = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, n, rows);
        if (graph_place(g, be, pyqsa_ggml_qsa_topk(g.ctx, x, nullptr, 512))) {
            ggml_backend_tensor_set(x, v.data(), 0, ggml_nbytes(x));
            std::printf("  QSA_TOPK(n=%lld,rows=%lld,k=512)%s %s: %.1f us/run\n", (long long) n, (long long) rows,
                        *one ? " PYQSA_CUDA_TOPK_ONE_CTA=1" : "", ggml_backend_dev_name(dev), time_graph(be, g.gf, 200));
        }
        unsetenv("PYQSA_CUDA_TOPK_ONE_CTA");
        ggml_backend_free(be);
    }
}

// A prefill chunk's block selection in one indexed layer, as qsa-positional.cpp builds it: the
// scores of every block key for each query (QSA_SCORE), then top-k. Timed both ways, so top-k's
// cost is the difference.
void perf_select(ggml_backend_t be, int64_t n_tps, int64_t n_blocks, int iters) {
    const int64_t Di = 128, n_head = 4, kb = 512;
    for (int upto = 0; upto < 2; ++upto) {
        ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
        ggml_context * ctx  = ggml_init(ip);
        ggml_tensor *  q    = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, Di, n_head, n_tps, 1);
        ggml_tensor *  k    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, Di, n_blocks, 1);
        ggml_tensor *  out  = pyqsa_ggml_qsa_score(ctx, q, k, 0.088f);
        if (upto >= 1) out = pyqsa_ggml_qsa_topk(ctx, out, nullptr, kb);
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        std::vector<float> x(ggml_nelements(q) + ggml_nelements(k));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::mt19937 rng(7);
        for (auto & v : x) v = nd(rng);
        ggml_backend_tensor_set(q, x.data(), 0, ggml_nbytes(q));
        ggml_backend_tensor_set(k, x.data() + ggml_nelements(q), 0, ggml_nbytes(k));
        const char * what[] = { "QSA_SCORE", "QSA_SCORE + QSA_TOPK" };
        std::printf("  prefill selection (n_tps=%lld, n_blocks=%lld, Di=%lld, n_head=%lld, kb=%lld) %s %s: %.1f us/run\n",
                    (long long) n_tps, (long long) n_blocks, (long long) Di, (long long) n_head, (long long) kb,
                    what[upto], ggml_backend_name(be), time_graph(be, gf, iters));
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
}

int cmd_perf(const char * only_backend) {
    std::mt19937 rng(99);
    // decode: one query per slot, Flash-Next attention shape, budget 2048 + tail
    const attn_case shapes[] = {
        { GGML_TYPE_F16, 256, 24, 2, 1, 1, 262144, 2051, 0.0, false },
        { GGML_TYPE_F16, 256, 24, 2, 1, 8, 32768, 2051, 0.0, false },
        { GGML_TYPE_Q8_0, 256, 24, 2, 1, 8, 32768, 2051, 0.0, false },
        // prefill: one 512-query chunk (timed on GPUs only: minutes on a CPU)
        { GGML_TYPE_F16, 256, 24, 2, 512, 1, 32768, 2051, 0.0, false },
    };
    // decode scoring, Flash-Next indexer (4 heads x 128, ratio 4): 256K x 1 and x 8, 32K x 8
    const score_case score_shapes[] = {
        { 128, 4, 1, 1, 65536, false, 0 },
        { 128, 4, 1, 8, 65536, false, 0 },
        { 128, 4, 1, 8, 8192, false, 0 },
    };
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
        const int iters = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? 3 : 200;
        for (const attn_case & c : shapes) {
            if (c.n_q > 1 && ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;
            const attn_data d = make_data(c, rng);
            // f16 calls twice on a GPU: the tensor-core kernel, then the CUDA-core one
            for (const char * mma : { "", "0" }) {
                if (*mma && (c.type != GGML_TYPE_F16 || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU)) continue;
                if (*mma) setenv("PYQSA_QSA_ATTN_MMA", mma, 1);
                graph_run g;
                if (build(g, be, c, d, 0.0625f)) {
                    const double us = time_graph(be, g.gf, iters);
                    // K and V rows of the listed cells, once per kv head
                    const double bytes = 2.0 * c.ns * c.n_q * c.n_sel * c.Hkv * ggml_row_size(c.type, c.D);
                    std::printf("  %s%s %s: %.1f us/run, %.1f GB/s of K/V rows\n", c.name().c_str(),
                                *mma ? " PYQSA_QSA_ATTN_MMA=0" : "", ggml_backend_dev_name(dev), us, bytes / us / 1e3);
                }
                unsetenv("PYQSA_QSA_ATTN_MMA");
            }
        }
        for (const score_case & c : score_shapes) {
            ggml_init_params ip = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true };
            ggml_context * ctx = ggml_init(ip);
            ggml_tensor * q   = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.D, c.n_head, c.n_tps, c.ns);
            ggml_tensor * k   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.D, c.n_blocks, c.ns);
            ggml_tensor * out = pyqsa_ggml_qsa_score(ctx, q, k, 0.088f);
            if (ggml_backend_supports_op(be, out)) {
                ggml_cgraph * gf = ggml_new_graph(ctx);
                ggml_build_forward_expand(gf, out);
                ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
                ggml_backend_buffer_clear(buf, 0);
                const double us = time_graph(be, gf, iters);
                std::printf("  %s %s: %.1f us/run, %.1f GB/s of block keys\n", c.name().c_str(), ggml_backend_dev_name(dev),
                            us, (double) ggml_nbytes(k) / us / 1e3);
                ggml_backend_buffer_free(buf);
            }
            ggml_free(ctx);
        }
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            // a decode step's top-k: 1 and 8 rows at 256K (65536 blocks), 8 at 32K
            perf_topk(dev, 65536, 1);
            perf_topk(dev, 65536, 8);
            perf_topk(dev, 8192, 8);
            // a 512-query and a 2048-query chunk at 256K (65536 blocks), 2048 queries at 32K
            perf_select(be, 512, 65536, 20);
            perf_select(be, 2048, 65536, 10);
            perf_select(be, 2048, 8192, 20);
        }
        ggml_backend_free(be);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv, { { "test", cmd_test }, { "perf", cmd_perf } });
}
