// qwen4exp's fused ops as pyqsa runs them, each against the graph of upstream's ops it replaces,
// bit for bit on each backend, then every other backend's op against the CPU's:
// PYQSA_GGML_OP_HC_COMBINE (ggml_scale, ggml_sigmoid, ggml_scale by 2, ggml_dsv4_hc_post without
// comb), PYQSA_GGML_OP_SILU_SCALED (ggml_scale then ggml_silu), PYQSA_GGML_OP_GDN_GATES
// (ggml_add, ggml_softplus, ggml_mul; ggml_sigmoid), PYQSA_GGML_OP_ADD_GATED (ggml_sigmoid,
// ggml_mul, ggml_add), PYQSA_GGML_OP_CONV_STEP (ggml_concat, ggml_ssm_conv, ggml_silu and the
// state's copy, its output and its store side by side) and PYQSA_GGML_OP_RMS_NORM_GATED
// (ggml_rms_norm, ggml_mul by the weight, ggml_sigmoid, ggml_mul). `perf` times both ways at
// decode and prefill shapes.
//
//   test-fused [test|perf] [-b BACKEND]      exit code 0 when every case passed
#include "op-check.h"
#include "pyqsa-ggml.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

// x [n_embd, n_tokens] (with x_pad, a view whose rows are x_pad floats wider), residual
// [n_embd, hc, n_tokens], inject [hc, n_tokens] (with inject_pad, a view of a wider tensor)
struct hc_case {
    int64_t n_embd, hc, n_tokens, x_pad, inject_pad;

    std::string name() const {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "HC_COMBINE(n_embd=%lld,hc=%lld,n_tokens=%lld%s)", (long long) n_embd,
                      (long long) hc, (long long) n_tokens, x_pad || inject_pad ? ",views" : "");
        return buf;
    }
};

struct hc_data {
    std::vector<float> x, residual, inject;  // the buffers the tensors (or views) read
};

// inject spans the sigmoid's range, its tails saturated
hc_data make_data(const hc_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    hc_data                         d;
    d.x.resize((c.n_embd + c.x_pad) * c.n_tokens);
    d.residual.resize(c.n_embd * c.hc * c.n_tokens);
    d.inject.resize((c.hc + c.inject_pad) * c.n_tokens);
    for (float & v : d.x) v = nd(rng);
    for (float & v : d.residual) v = 4.0f * nd(rng);
    for (float & v : d.inject) v = 12.0f * nd(rng);
    return d;
}

struct hc_tensors {
    ggml_tensor *x_buf, *residual, *inject_buf, *out;
};

// the op (fused) or upstream's graph of it, as qwen4exp's build_hc_combine makes them
hc_tensors make_hc(ggml_context * ctx, const hc_case & c, bool fused) {
    hc_tensors t;
    t.x_buf               = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_embd + c.x_pad, c.n_tokens);
    t.residual            = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.n_embd, c.hc, c.n_tokens);
    t.inject_buf          = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.hc + c.inject_pad, c.n_tokens);
    ggml_tensor * x       = ggml_view_2d(ctx, t.x_buf, c.n_embd, c.n_tokens, t.x_buf->nb[1], 0);
    ggml_tensor * inject  = ggml_view_2d(ctx, t.inject_buf, c.hc, c.n_tokens, t.inject_buf->nb[1], 0);
    const float   inv_hc  = 1.0f / (float) c.hc;
    // (upstream's CPU scale takes only contiguous rows: a copy of a view first, which changes no bit)
    if (fused) {
        t.out = pyqsa_ggml_hc_combine(ctx, x, t.residual, inject, inv_hc);
    } else {
        ggml_tensor * w = ggml_sigmoid(ctx, ggml_scale(ctx, ggml_cont(ctx, inject), inv_hc));
        w               = ggml_scale(ctx, w, 2.0f);
        t.out           = ggml_dsv4_hc_post(ctx, x, t.residual, w, nullptr);
    }
    return t;
}

size_t ctx_size() {
    return ggml_tensor_overhead() * 16 + ggml_graph_overhead();
}

// the result on be; empty when be does not support the graph
std::vector<float> run(ggml_backend_t be, const hc_case & c, const hc_data & d, bool fused) {
    hc_tensors t{};
    bool       supported = false;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            t = make_hc(ctx, c, fused);
            return std::make_pair(t.x_buf, t.out);
        },
        [&](ggml_tensor * x_buf) {
            ggml_backend_tensor_set(x_buf, d.x.data(), 0, ggml_nbytes(x_buf));
            ggml_backend_tensor_set(t.residual, d.residual.data(), 0, ggml_nbytes(t.residual));
            ggml_backend_tensor_set(t.inject_buf, d.inject.data(), 0, ggml_nbytes(t.inject_buf));
        },
        &supported);
}

// how many elements differ in their bits (all of them when the sizes differ)
size_t bits_differ(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size() || a.empty()) return a.size() + b.size() + 1;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
}

// x [n, rows] (with pad, a view whose rows are pad floats wider)
struct silu_case {
    int64_t n, rows, pad;

    std::string name() const {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "SILU_SCALED(n=%lld,rows=%lld%s)", (long long) n, (long long) rows,
                      pad ? ",view" : "");
        return buf;
    }
};

// silu(x / 4) as the op (fused) or as upstream's two ops
ggml_tensor * make_silu(ggml_context * ctx, const silu_case & c, bool fused, ggml_tensor ** buf) {
    *buf            = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    ggml_tensor * x = ggml_view_2d(ctx, *buf, c.n, c.rows, (*buf)->nb[1], 0);
    return fused ? pyqsa_ggml_silu_scaled(ctx, x, 0.25f) : ggml_silu(ctx, ggml_scale(ctx, ggml_cont(ctx, x), 0.25f));
}

std::vector<float> run_silu(ggml_backend_t be, const silu_case & c, const std::vector<float> & x, bool fused) {
    bool supported = false;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            ggml_tensor * buf = nullptr;
            ggml_tensor * out = make_silu(ctx, c, fused, &buf);
            return std::make_pair(buf, out);
        },
        [&](ggml_tensor * buf) { ggml_backend_tensor_set(buf, x.data(), 0, ggml_nbytes(buf)); }, &supported);
}

// alpha and beta [H, T, S] (with pad, views whose rows are pad floats wider), dt_bias and a [H]
struct gates_case {
    int64_t H, T, S, pad;

    std::string name() const {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "GDN_GATES(H=%lld,T=%lld,S=%lld%s)", (long long) H, (long long) T,
                      (long long) S, pad ? ",views" : "");
        return buf;
    }
};

struct gates_data {
    std::vector<float> alpha, beta, dt, a;
};

// alpha + dt_bias on both sides of softplus's cut at 20, beta into the sigmoid's tails, a < 0
gates_data make_gates_data(const gates_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    gates_data                      d;
    d.alpha.resize((c.H + c.pad) * c.T * c.S);
    d.beta.resize(d.alpha.size());
    d.dt.resize(c.H);
    d.a.resize(c.H);
    for (float & v : d.alpha) v = 10.0f * nd(rng);
    for (float & v : d.beta) v = 12.0f * nd(rng);
    for (float & v : d.dt) v = 4.0f * nd(rng) + 4.0f;
    for (float & v : d.a) v = -std::exp(nd(rng));
    return d;
}

struct gates_tensors {
    ggml_tensor *alpha_buf, *beta_buf, *dt, *a, *out;
};

// the op (fused) or upstream's ops as qwen4exp's build_layer_attn_linear makes them, the two
// gates concatenated as the op lays them out ([H, T, S, 2]; a concat copies their bits)
gates_tensors make_gates(ggml_context * ctx, const gates_case & c, bool fused) {
    gates_tensors t;
    t.alpha_buf         = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.H + c.pad, c.T, c.S);
    t.beta_buf          = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.H + c.pad, c.T, c.S);
    t.dt                = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.H);
    t.a                 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.H);
    ggml_tensor * alpha = ggml_view_3d(ctx, t.alpha_buf, c.H, c.T, c.S, t.alpha_buf->nb[1], t.alpha_buf->nb[2], 0);
    ggml_tensor * beta  = ggml_view_3d(ctx, t.beta_buf, c.H, c.T, c.S, t.beta_buf->nb[1], t.beta_buf->nb[2], 0);
    if (fused) {
        t.out = pyqsa_ggml_gdn_gates(ctx, alpha, beta, t.dt, t.a);
    } else {
        // (upstream's CPU unary ops take only contiguous rows: copies of the views first)
        ggml_tensor * gate = ggml_mul(ctx, ggml_softplus(ctx, ggml_add(ctx, ggml_cont(ctx, alpha), t.dt)), t.a);
        ggml_tensor * sg   = ggml_sigmoid(ctx, ggml_cont(ctx, beta));
        t.out              = ggml_concat(ctx, ggml_reshape_4d(ctx, gate, c.H, c.T, c.S, 1),
                                         ggml_reshape_4d(ctx, sg, c.H, c.T, c.S, 1), 3);
    }
    return t;
}

std::vector<float> run_gates(ggml_backend_t be, const gates_case & c, const gates_data & d, bool fused) {
    gates_tensors t{};
    bool          supported = false;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            t = make_gates(ctx, c, fused);
            return std::make_pair(t.alpha_buf, t.out);
        },
        [&](ggml_tensor * alpha_buf) {
            ggml_backend_tensor_set(alpha_buf, d.alpha.data(), 0, ggml_nbytes(alpha_buf));
            ggml_backend_tensor_set(t.beta_buf, d.beta.data(), 0, ggml_nbytes(t.beta_buf));
            ggml_backend_tensor_set(t.dt, d.dt.data(), 0, ggml_nbytes(t.dt));
            ggml_backend_tensor_set(t.a, d.a.data(), 0, ggml_nbytes(t.a));
        },
        &supported);
}

// base and x [n, rows] (with pad, views whose rows are pad floats wider), g [1, rows] (with pad, a
// view of a wider tensor)
struct add_gated_case {
    int64_t n, rows, pad;

    std::string name() const {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "ADD_GATED(n=%lld,rows=%lld%s)", (long long) n, (long long) rows,
                      pad ? ",views" : "");
        return buf;
    }
};

struct add_gated_tensors {
    ggml_tensor *base_buf, *x_buf, *g_buf, *out;
};

// the op (fused) or upstream's ops as qwen4exp's build_layer_ffn makes them
add_gated_tensors make_add_gated(ggml_context * ctx, const add_gated_case & c, bool fused) {
    add_gated_tensors t;
    t.base_buf         = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    t.x_buf            = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    t.g_buf            = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1 + c.pad, c.rows);
    ggml_tensor * base = ggml_view_2d(ctx, t.base_buf, c.n, c.rows, t.base_buf->nb[1], 0);
    ggml_tensor * x    = ggml_view_2d(ctx, t.x_buf, c.n, c.rows, t.x_buf->nb[1], 0);
    ggml_tensor * g    = ggml_view_2d(ctx, t.g_buf, 1, c.rows, t.g_buf->nb[1], 0);
    if (fused) {
        t.out = pyqsa_ggml_add_gated(ctx, base, x, g);
    } else {
        ggml_tensor * w = ggml_sigmoid(ctx, ggml_cont(ctx, g));
        t.out           = ggml_add(ctx, ggml_cont(ctx, base), ggml_mul(ctx, ggml_cont(ctx, x), w));
    }
    return t;
}

std::vector<float> run_add_gated(ggml_backend_t be, const add_gated_case & c, const std::vector<float> & v,
                                 bool fused) {
    add_gated_tensors t{};
    bool              supported = false;
    const size_t      nb = (c.n + c.pad) * c.rows;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            t = make_add_gated(ctx, c, fused);
            return std::make_pair(t.base_buf, t.out);
        },
        [&](ggml_tensor * base_buf) {
            ggml_backend_tensor_set(base_buf, v.data(), 0, ggml_nbytes(base_buf));
            ggml_backend_tensor_set(t.x_buf, v.data() + nb, 0, ggml_nbytes(t.x_buf));
            ggml_backend_tensor_set(t.g_buf, v.data() + 2 * nb, 0, ggml_nbytes(t.g_buf));
        },
        &supported);
}

// a decode step's convolution: state [K-1, C, S], x [C, 1, S], kernel [K, C], the store [(K-1) C, S]
struct conv_case {
    int64_t K, C, S;

    std::string name() const {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "CONV_STEP(K=%lld,C=%lld,S=%lld)", (long long) K, (long long) C, (long long) S);
        return buf;
    }
};

struct conv_tensors {
    ggml_tensor *state, *x, *kernel, *store, *out;
};

// the op (fused) or upstream's ops as qwen4exp's build_conv_state_at and ssm_conv make them, the
// result [C + (K-1) C, S]: each sequence's output, then its stored state (a concat copies bits)
conv_tensors make_conv(ggml_context * ctx, const conv_case & c, bool fused) {
    conv_tensors t;
    t.state  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.K - 1, c.C, c.S);
    t.x      = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.C, 1, c.S);
    t.kernel = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.K, c.C);
    t.store  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, (c.K - 1) * c.C, c.S);
    ggml_tensor * y = nullptr;
    ggml_tensor * stored = nullptr;
    if (fused) {
        y      = pyqsa_ggml_conv_step(ctx, t.state, t.x, t.kernel, t.store);
        stored = ggml_view_2d(ctx, t.store, t.store->ne[0], c.S, t.store->nb[1], 0);  // read after y
    } else {
        ggml_tensor * input = ggml_concat(ctx, t.state, ggml_transpose(ctx, t.x), 0);
        y = ggml_silu(ctx, ggml_ssm_conv(ctx, input, t.kernel));
        ggml_tensor * tail = ggml_view_3d(ctx, input, c.K - 1, c.C, c.S, input->nb[1], input->nb[2], sizeof(float));
        stored = ggml_cpy(ctx, ggml_cont(ctx, tail), t.store);
    }
    t.out = ggml_concat(ctx, ggml_reshape_2d(ctx, y, c.C, c.S), stored, 0);
    return t;
}
std::vector<float> run_conv(ggml_backend_t be, const conv_case & c, const std::vector<float> & v, bool fused) {
    conv_tensors t{};
    bool         supported = false;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            t = make_conv(ctx, c, fused);
            return std::make_pair(t.state, t.out);
        },
        [&](ggml_tensor * state) {
            const float * p = v.data();
            for (ggml_tensor * in : { state, t.x, t.kernel, t.store }) {
                ggml_backend_tensor_set(in, p, 0, ggml_nbytes(in));
                p += ggml_nelements(in);
            }
        },
        &supported);
}

// x and z [n, rows] (with pad, views whose rows are pad floats wider), w [n]
struct norm_case {
    int64_t n, rows, pad;

    std::string name() const {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "RMS_NORM_GATED(n=%lld,rows=%lld%s)", (long long) n, (long long) rows,
                      pad ? ",views" : "");
        return buf;
    }
};

struct norm_tensors {
    ggml_tensor *x_buf, *z_buf, *w, *out;
};

// the op (fused) or upstream's ops as qwen4exp's build_norm_gated makes them
norm_tensors make_norm(ggml_context * ctx, const norm_case & c, bool fused) {
    norm_tensors t;
    t.x_buf         = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    t.z_buf         = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    t.w             = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n);
    ggml_tensor * x = ggml_view_2d(ctx, t.x_buf, c.n, c.rows, t.x_buf->nb[1], 0);
    ggml_tensor * z = ggml_view_2d(ctx, t.z_buf, c.n, c.rows, t.z_buf->nb[1], 0);
    const float eps = 1e-6f;
    if (fused) {
        t.out = pyqsa_ggml_rms_norm_gated(ctx, x, t.w, z, eps);
    } else {
        ggml_tensor * normed = ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), t.w);
        t.out                = ggml_mul(ctx, normed, ggml_sigmoid(ctx, ggml_cont(ctx, z)));
    }
    return t;
}

std::vector<float> run_norm(ggml_backend_t be, const norm_case & c, const std::vector<float> & v, bool fused) {
    norm_tensors t{};
    bool         supported = false;
    const size_t nb = (c.n + c.pad) * c.rows;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            t = make_norm(ctx, c, fused);
            return std::make_pair(t.x_buf, t.out);
        },
        [&](ggml_tensor * x_buf) {
            ggml_backend_tensor_set(x_buf, v.data(), 0, ggml_nbytes(x_buf));
            ggml_backend_tensor_set(t.z_buf, v.data() + nb, 0, ggml_nbytes(t.z_buf));
            ggml_backend_tensor_set(t.w, v.data() + 2 * nb, 0, ggml_nbytes(t.w));
        },
        &supported);
}

// another backend's expf (CUDA's fast-math one: ~1e-6 relative at |x| ~ 10) and its contraction
// of the sum into an FMA, against the CPU's; a wrong element would give ~1
constexpr double BOUND = 1e-10;

// an op against upstream's ops: run(be, fused) on the CPU and on every other backend, bit for bit
// on each, and each other backend's op against the CPU's
template <typename Run>
void check_fused(const std::string & name, ggml_backend_t cpu, const char * only_backend, int & n_ok, int & n_fail,
                 Run && run) {
    const std::vector<float> fused = run(cpu, true);
    const size_t             n_cpu = bits_differ(fused, run(cpu, false));
    report(name, "CPU", "vs upstream's ops: " + std::to_string(n_cpu) + " elements differ in their bits ", n_cpu == 0,
           n_ok, n_fail);
    on_other_backends(only_backend, name, n_ok, n_fail, [&](ggml_backend_t be) {
        const std::vector<float> f = run(be, true);
        if (f.empty()) return std::make_pair(false, std::string("not supported "));
        const size_t n = bits_differ(f, run(be, false));
        const double e = nmse(f, fused);
        return std::make_pair(n == 0 && e < BOUND, "vs upstream's ops there: " + std::to_string(n) +
                                                       " elements differ in their bits; vs CPU: nmse " + sci(e) + " ");
    });
}

int cmd_test(const char * only_backend) {
    std::mt19937 rng(41);
    int n_ok = 0, n_fail = 0;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, 4);
    const hc_case cases[] = {
        { 2048, 4, 1, 0, 0 },    // a decode step of one sequence
        { 2048, 4, 8, 0, 0 },    // eight
        { 256, 4, 300, 0, 0 },   // a prefill chunk
        { 96, 2, 17, 8, 3 },     // x and inject views of wider tensors
        { 33, 3, 5, 1, 1 },      // odd sizes
    };
    for (const hc_case & c : cases) {
        const hc_data d = make_data(c, rng);
        check_fused(c.name(), cpu, only_backend, n_ok, n_fail,
                    [&](ggml_backend_t be, bool fused) { return run(be, c, d, fused); });
    }
    // the rank of the gate (64 of the model's, a row per token) and odd ones past the SIMD width
    const silu_case silu_cases[] = { { 64, 1, 0 }, { 64, 8, 0 }, { 64, 300, 0 }, { 37, 5, 3 }, { 7, 2, 0 } };
    std::normal_distribution<float> nd(0.0f, 8.0f);
    for (const silu_case & c : silu_cases) {
        std::vector<float> x((c.n + c.pad) * c.rows);
        for (float & v : x) v = nd(rng);
        check_fused(c.name(), cpu, only_backend, n_ok, n_fail,
                    [&](ggml_backend_t be, bool fused) { return run_silu(be, c, x, fused); });
    }
    // Flash-Next's 32 value heads at 1 and 8 sequences and a prefill chunk, then odd sizes
    const gates_case gates_cases[] = { { 32, 1, 1, 0 }, { 32, 1, 8, 0 }, { 32, 300, 1, 0 }, { 7, 3, 2, 5 } };
    for (const gates_case & c : gates_cases) {
        const gates_data d = make_gates_data(c, rng);
        check_fused(c.name(), cpu, only_backend, n_ok, n_fail,
                    [&](ggml_backend_t be, bool fused) { return run_gates(be, c, d, fused); });
    }
    // the model's width at 1 and 8 tokens and a chunk, then views and odd sizes
    const add_gated_case add_cases[] = { { 2048, 1, 0 }, { 2048, 8, 0 }, { 256, 300, 0 }, { 37, 5, 3 } };
    std::normal_distribution<float> wide(0.0f, 6.0f);
    for (const add_gated_case & c : add_cases) {
        std::vector<float> v(2 * (c.n + c.pad) * c.rows + (1 + c.pad) * c.rows);
        for (float & e : v) e = wide(rng);
        check_fused(c.name(), cpu, only_backend, n_ok, n_fail,
                    [&](ggml_backend_t be, bool fused) { return run_add_gated(be, c, v, fused); });
    }
    // Flash-Next's 8192 channels of 4 taps at 1 and 8 sequences, then odd sizes
    const conv_case conv_cases[] = { { 4, 8192, 1 }, { 4, 8192, 8 }, { 4, 37, 3 }, { 2, 5, 2 }, { 7, 19, 2 } };
    for (const conv_case & c : conv_cases) {
        std::vector<float> v(2 * (c.K - 1) * c.C * c.S + c.C * c.S + c.K * c.C);
        for (float & e : v) e = wide(rng);
        check_fused(c.name(), cpu, only_backend, n_ok, n_fail,
                    [&](ggml_backend_t be, bool fused) { return run_conv(be, c, v, fused); });
    }
    // Flash-Next's value heads (128 wide, 32 a token) at 1 and 8 tokens, a chunk, views, a row wider
    // than upstream's one-block cut (1024) and an odd one
    const norm_case norm_cases[] = { { 128, 32, 0 }, { 128, 256, 0 }, { 128, 4096, 0 }, { 64, 9, 5 }, { 1536, 3, 0 },
                                     { 37, 4, 0 } };
    for (const norm_case & c : norm_cases) {
        std::vector<float> v(2 * (c.n + c.pad) * c.rows + c.n);
        for (float & e : v) e = wide(rng);
        check_fused(c.name(), cpu, only_backend, n_ok, n_fail,
                    [&](ggml_backend_t be, bool fused) { return run_norm(be, c, v, fused); });
    }
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

// Flash-Next's width, streams and gate rank: a decode step of 1 and 8 sequences and a 2048-token
// chunk, each op and upstream's ops; inputs zero (the time does not depend on them)
// the microseconds of a graph of make(ctx, fused) on be, the op's and upstream's, inputs zero
template <typename Make>
void time_both(ggml_backend_t be, const std::string & name, int iters, Make && make) {
    for (const bool fused : { true, false }) {
        graph_run g;
        ggml_init_params ip = { ctx_size(), nullptr, true };
        g.ctx               = ggml_init(ip);
        if (graph_place(g, be, make(g.ctx, fused))) {
            ggml_backend_buffer_clear(g.buf, 0);
            std::printf("  %s %s %s: %.1f us/run\n", name.c_str(), fused ? "op" : "upstream's ops",
                        ggml_backend_name(be), time_graph(be, g.gf, iters));
        }
    }
}

int cmd_perf(const char * only_backend) {
    const hc_case shapes[] = { { 2048, 4, 1, 0, 0 }, { 2048, 4, 8, 0, 0 }, { 2048, 4, 2048, 0, 0 } };
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        ggml_backend_t be    = ggml_backend_dev_init(dev, nullptr);
        const int      iters = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? 5 : 200;
        for (const hc_case & c : shapes) {
            time_both(be, c.name(), iters, [&](ggml_context * ctx, bool fused) { return make_hc(ctx, c, fused).out; });
        }
        for (const silu_case & c : { silu_case{ 64, 1, 0 }, silu_case{ 64, 8, 0 }, silu_case{ 64, 2048, 0 } }) {
            time_both(be, c.name(), iters, [&](ggml_context * ctx, bool fused) {
                ggml_tensor * buf = nullptr;
                return make_silu(ctx, c, fused, &buf);
            });
        }
        for (const gates_case & c : { gates_case{ 32, 1, 1, 0 }, gates_case{ 32, 1, 8, 0 }, gates_case{ 32, 2048, 1, 0 } }) {
            time_both(be, c.name(), iters, [&](ggml_context * ctx, bool fused) { return make_gates(ctx, c, fused).out; });
        }
        for (const add_gated_case & c : { add_gated_case{ 2048, 1, 0 }, add_gated_case{ 2048, 8, 0 },
                                          add_gated_case{ 2048, 2048, 0 } }) {
            time_both(be, c.name(), iters,
                      [&](ggml_context * ctx, bool fused) { return make_add_gated(ctx, c, fused).out; });
        }
        for (const conv_case & c : { conv_case{ 4, 8192, 1 }, conv_case{ 4, 8192, 8 } }) {
            time_both(be, c.name(), iters, [&](ggml_context * ctx, bool fused) { return make_conv(ctx, c, fused).out; });
        }
        for (const norm_case & c : { norm_case{ 128, 32, 0 }, norm_case{ 128, 256, 0 }, norm_case{ 128, 65536, 0 } }) {
            time_both(be, c.name(), iters, [&](ggml_context * ctx, bool fused) { return make_norm(ctx, c, fused).out; });
        }
        ggml_backend_free(be);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv, { { "test", cmd_test }, { "perf", cmd_perf } });
}
