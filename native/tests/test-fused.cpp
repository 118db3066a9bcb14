// qwen4exp's fused ops as pyqsa runs them, each against the graph of upstream's ops it replaces,
// bit for bit on each backend, then every other backend's op against the CPU's:
// PYQSA_GGML_OP_HC_COMBINE (ggml_scale, ggml_sigmoid, ggml_scale by 2, ggml_dsv4_hc_post without
// comb; its gated form with ggml_sigmoid, ggml_mul and ggml_add before), PYQSA_GGML_OP_SILU_SCALED (ggml_scale then ggml_silu), PYQSA_GGML_OP_GDN_GATES
// (ggml_add, ggml_softplus, ggml_mul; ggml_sigmoid), PYQSA_GGML_OP_ADD_GATED (ggml_sigmoid,
// ggml_mul, ggml_add), PYQSA_GGML_OP_CONV_STEP (ggml_concat, ggml_ssm_conv, ggml_silu and the
// state's copy, its output and its store side by side) and PYQSA_GGML_OP_RMS_NORM_GATED
// (ggml_rms_norm, ggml_mul by the weight, ggml_sigmoid, ggml_mul). A decode step's GDN_GATES and
// CONV_STEP in one graph, as qwen4exp's has them, are checked the same way, and on CUDA, which runs
// the two as one launch, against their launches apart. `perf` times both ways at decode and
// prefill shapes.
//
//   test-fused [test|perf] [-b BACKEND]      exit code 0 when every case passed
#include "op-check.h"
#include "pyqsa-ggml.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

// a graph of one op or of upstream's ops for it: the tensors it reads (buffers, whose views it
// may take), filled in this order from one vector, and its result
struct op_graph {
    std::vector<ggml_tensor *> inputs;
    ggml_tensor *              out = nullptr;
};

// the result of make(ctx) on be, its inputs filled from data; empty when be does not support it
template <typename Make>
std::vector<float> run_graph(ggml_backend_t be, const std::vector<float> & data, Make && make) {
    op_graph g;
    bool     supported = false;
    return run_op<float>(
        be,
        [&](ggml_context * ctx) {
            g = make(ctx);
            return std::make_pair(g.inputs[0], g.out);
        },
        [&](ggml_tensor *) {
            const float * p = data.data();
            for (ggml_tensor * in : g.inputs) {
                if (in->type != GGML_TYPE_F32) {  // the floats rounded to the input's type
                    std::vector<uint8_t> q(ggml_nbytes(in));
                    ggml_get_type_traits_cpu(in->type)->from_float(p, q.data(), ggml_nelements(in));
                    ggml_backend_tensor_set(in, q.data(), 0, q.size());
                } else {
                    ggml_backend_tensor_set(in, p, 0, ggml_nbytes(in));
                }
                p += ggml_nelements(in);
            }
        },
        &supported);
}

// x [n_embd, n_tokens] (with x_pad, a view whose rows are x_pad floats wider), residual
// [n_embd, hc, n_tokens], inject [hc, n_tokens] (with inject_pad, a view of a wider tensor); gated:
// the block's output is the join x + joined * sigmoid(g), joined [n_embd, n_tokens], g [1, n_tokens]
struct hc_case {
    int64_t n_embd, hc, n_tokens, x_pad, inject_pad;
    bool    gated = false;

    std::string name() const {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "HC_COMBINE(%sn_embd=%lld,hc=%lld,n_tokens=%lld%s)", gated ? "gated," : "",
                      (long long) n_embd, (long long) hc, (long long) n_tokens,
                      x_pad || inject_pad ? ",views" : "");
        return buf;
    }
};

// x, residual, inject, then the join's joined and g; inject and g span the sigmoid's range, their
// tails saturated
std::vector<float> make_data(const hc_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n_x = (c.n_embd + c.x_pad) * c.n_tokens, n_res = c.n_embd * c.hc * c.n_tokens;
    const int64_t n_in = (c.hc + c.inject_pad) * c.n_tokens, n_joined = c.gated ? c.n_embd * c.n_tokens : 0;
    std::vector<float> d(n_x + n_res + n_in + n_joined + (c.gated ? c.n_tokens : 0));
    for (int64_t i = 0; i < (int64_t) d.size(); ++i) {
        const int64_t joined = n_x + n_res + n_in;
        d[i] = (i < n_x ? 1.0f : i < n_x + n_res ? 4.0f : i < joined ? 12.0f : i < joined + n_joined ? 1.0f : 12.0f) *
               nd(rng);
    }
    return d;
}

// the op (fused) or upstream's graph of it, as qwen4exp's build_hc_combine makes them
op_graph make_hc(ggml_context * ctx, const hc_case & c, bool fused) {
    ggml_tensor * x_buf      = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_embd + c.x_pad, c.n_tokens);
    ggml_tensor * residual   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.n_embd, c.hc, c.n_tokens);
    ggml_tensor * inject_buf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.hc + c.inject_pad, c.n_tokens);
    ggml_tensor * x          = ggml_view_2d(ctx, x_buf, c.n_embd, c.n_tokens, x_buf->nb[1], 0);
    ggml_tensor * inject     = ggml_view_2d(ctx, inject_buf, c.hc, c.n_tokens, inject_buf->nb[1], 0);
    const float   inv_hc     = 1.0f / (float) c.hc;
    ggml_tensor * joined     = c.gated ? ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_embd, c.n_tokens) : nullptr;
    ggml_tensor * g          = c.gated ? ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, c.n_tokens) : nullptr;
    ggml_tensor * out        = nullptr;
    // (upstream's CPU scale takes only contiguous rows: a copy of a view first, which changes no bit)
    if (fused) {
        out = c.gated ? pyqsa_ggml_hc_combine_gated(ctx, x, joined, g, residual, inject, inv_hc) :
                        pyqsa_ggml_hc_combine(ctx, x, residual, inject, inv_hc);
    } else {
        if (c.gated) {  // qwen4exp's build_layer_ffn: the shared expert's gated join
            x = ggml_add(ctx, ggml_cont(ctx, x), ggml_mul(ctx, joined, ggml_sigmoid(ctx, g)));
        }
        ggml_tensor * w = ggml_sigmoid(ctx, ggml_scale(ctx, ggml_cont(ctx, inject), inv_hc));
        w               = ggml_scale(ctx, w, 2.0f);
        out             = ggml_dsv4_hc_post(ctx, x, residual, w, nullptr);
    }
    if (c.gated) {
        return { { x_buf, residual, inject_buf, joined, g }, out };
    }
    return { { x_buf, residual, inject_buf }, out };
}

size_t ctx_size() {
    return ggml_tensor_overhead() * 32 + ggml_graph_overhead();
}

// how many elements differ in their bits (all of them when the sizes differ)
size_t bits_differ(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size() || a.empty()) return a.size() + b.size() + 1;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
}

// an elementwise op's rows of n floats; pad > 0: its inputs views whose rows are pad floats wider
struct rows_case {
    int64_t n, rows, pad;

    // "OP(n=..,rows=..)" and, with pad, the suffix that says its inputs are views
    std::string label(const char * op, const char * views) const {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "%s(n=%lld,rows=%lld%s)", op, (long long) n, (long long) rows,
                      pad ? views : "");
        return buf;
    }
};

// x [n, rows] (with pad, a view)
struct silu_case : rows_case {
    std::string name() const { return label("SILU_SCALED", ",view"); }
};

// silu(x / 4) as the op (fused) or as upstream's two ops
op_graph make_silu(ggml_context * ctx, const silu_case & c, bool fused) {
    ggml_tensor * buf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    ggml_tensor * x   = ggml_view_2d(ctx, buf, c.n, c.rows, buf->nb[1], 0);
    ggml_tensor * out =
        fused ? pyqsa_ggml_silu_scaled(ctx, x, 0.25f) : ggml_silu(ctx, ggml_scale(ctx, ggml_cont(ctx, x), 0.25f));
    return { { buf }, out };
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

// alpha, beta, dt_bias, then a: alpha + dt_bias on both sides of softplus's cut at 20, beta into
// the sigmoid's tails, a < 0
std::vector<float> make_gates_data(const gates_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t                   n_ab = (c.H + c.pad) * c.T * c.S;
    std::vector<float>              d(2 * n_ab + 2 * c.H);
    for (int64_t i = 0; i < (int64_t) d.size(); ++i) {
        const float v = nd(rng);
        d[i] = i < n_ab ? 10.0f * v : i < 2 * n_ab ? 12.0f * v : i < 2 * n_ab + c.H ? 4.0f * v + 4.0f : -std::exp(v);
    }
    return d;
}

// the op (fused) or upstream's ops as qwen4exp's build_layer_attn_linear makes them, the two
// gates concatenated as the op lays them out ([H, T, S, 2]; a concat copies their bits)
op_graph make_gates(ggml_context * ctx, const gates_case & c, bool fused) {
    ggml_tensor * alpha_buf = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.H + c.pad, c.T, c.S);
    ggml_tensor * beta_buf  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.H + c.pad, c.T, c.S);
    ggml_tensor * dt        = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.H);
    ggml_tensor * a         = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.H);
    ggml_tensor * alpha     = ggml_view_3d(ctx, alpha_buf, c.H, c.T, c.S, alpha_buf->nb[1], alpha_buf->nb[2], 0);
    ggml_tensor * beta      = ggml_view_3d(ctx, beta_buf, c.H, c.T, c.S, beta_buf->nb[1], beta_buf->nb[2], 0);
    ggml_tensor * out       = nullptr;
    if (fused) {
        out = pyqsa_ggml_gdn_gates(ctx, alpha, beta, dt, a);
    } else {
        // (upstream's CPU unary ops take only contiguous rows: copies of the views first)
        ggml_tensor * gate = ggml_mul(ctx, ggml_softplus(ctx, ggml_add(ctx, ggml_cont(ctx, alpha), dt)), a);
        ggml_tensor * sg   = ggml_sigmoid(ctx, ggml_cont(ctx, beta));
        out                = ggml_concat(ctx, ggml_reshape_4d(ctx, gate, c.H, c.T, c.S, 1),
                                         ggml_reshape_4d(ctx, sg, c.H, c.T, c.S, 1), 3);
    }
    return { { alpha_buf, beta_buf, dt, a }, out };
}

// base and x [n, rows] (with pad, views), g [1, rows] (with pad, a view of a wider tensor)
struct add_gated_case : rows_case {
    std::string name() const { return label("ADD_GATED", ",views"); }
};

// the op (fused) or upstream's ops as qwen4exp's build_layer_ffn makes them
op_graph make_add_gated(ggml_context * ctx, const add_gated_case & c, bool fused) {
    ggml_tensor * base_buf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    ggml_tensor * x_buf    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    ggml_tensor * g_buf    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1 + c.pad, c.rows);
    ggml_tensor * base     = ggml_view_2d(ctx, base_buf, c.n, c.rows, base_buf->nb[1], 0);
    ggml_tensor * x        = ggml_view_2d(ctx, x_buf, c.n, c.rows, x_buf->nb[1], 0);
    ggml_tensor * g        = ggml_view_2d(ctx, g_buf, 1, c.rows, g_buf->nb[1], 0);
    ggml_tensor * out      = nullptr;
    if (fused) {
        out = pyqsa_ggml_add_gated(ctx, base, x, g);
    } else {
        ggml_tensor * w = ggml_sigmoid(ctx, ggml_cont(ctx, g));
        out             = ggml_add(ctx, ggml_cont(ctx, base), ggml_mul(ctx, ggml_cont(ctx, x), w));
    }
    return { { base_buf, x_buf, g_buf }, out };
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

// whether upstream's ops run a case on the other backends: its CUDA ssm_conv aborts unless the
// channels are a multiple of its 128-thread blocks and the kernel width one it has an instance of
// (ggml-cuda/ssm-conv.cu); there the op is checked against the CPU only
template <typename Case> bool upstream_runs_off_cpu(const Case &) {
    return true;
}

bool upstream_runs_off_cpu(const conv_case & c) {
    return c.C % 128 == 0 && (c.K == 3 || c.K == 4 || c.K == 5 || c.K == 9 || c.K == 15);
}

// the op (fused) or upstream's ops as qwen4exp's build_conv_state_at and ssm_conv make them, the
// result [C + (K-1) C, S]: each sequence's output, then its stored state (a concat copies bits)
op_graph make_conv(ggml_context * ctx, const conv_case & c, bool fused) {
    ggml_tensor * state  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.K - 1, c.C, c.S);
    ggml_tensor * x      = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.C, 1, c.S);
    ggml_tensor * kernel = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.K, c.C);
    ggml_tensor * store  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, (c.K - 1) * c.C, c.S);
    ggml_tensor * y      = nullptr;
    ggml_tensor * stored = nullptr;
    if (fused) {
        y      = pyqsa_ggml_conv_step(ctx, state, x, kernel, store);
        stored = ggml_view_2d(ctx, store, store->ne[0], c.S, store->nb[1], 0);  // read after y
    } else {
        ggml_tensor * input = ggml_concat(ctx, state, ggml_transpose(ctx, x), 0);
        y                   = ggml_silu(ctx, ggml_ssm_conv(ctx, input, kernel));
        ggml_tensor * tail  = ggml_view_3d(ctx, input, c.K - 1, c.C, c.S, input->nb[1], input->nb[2], sizeof(float));
        stored              = ggml_cpy(ctx, ggml_cont(ctx, tail), store);
    }
    return { { state, x, kernel, store }, ggml_concat(ctx, ggml_reshape_2d(ctx, y, c.C, c.S), stored, 0) };
}

// a decode step's two gates and its convolution, of as many sequences (gates.T = 1)
struct gates_conv_case {
    gates_case gates;
    conv_case  conv;

    std::string name() const { return gates.name() + "+" + conv.name(); }
};

bool upstream_runs_off_cpu(const gates_conv_case & c) {
    return upstream_runs_off_cpu(c.conv);
}

// make_gates' data, then make_conv's
std::vector<float> make_gates_conv_data(const gates_conv_case & c, std::mt19937 & rng) {
    std::vector<float>              d = make_gates_data(c.gates, rng);
    std::normal_distribution<float> wide(0.0f, 6.0f);
    const conv_case &               v = c.conv;
    for (int64_t i = 0; i < 2 * (v.K - 1) * v.C * v.S + v.C * v.S + v.K * v.C; ++i) {
        d.push_back(wide(rng));
    }
    return d;
}

// make_gates' graph, then make_conv's, in qwen4exp's order (the gates, a reshape of them, then the
// convolution: CUDA's one launch); the result the gates' then the convolution's
op_graph make_gates_conv(ggml_context * ctx, const gates_conv_case & c, bool fused) {
    op_graph       g = make_gates(ctx, c.gates, fused);
    const op_graph v = make_conv(ctx, c.conv, fused);
    g.inputs.insert(g.inputs.end(), v.inputs.begin(), v.inputs.end());
    g.out = ggml_concat(ctx, ggml_reshape_1d(ctx, g.out, ggml_nelements(g.out)),
                        ggml_reshape_1d(ctx, v.out, ggml_nelements(v.out)), 0);
    return g;
}

// x and z [n, rows] (with pad, views), w [n]
struct norm_case : rows_case {
    std::string name() const { return label("RMS_NORM_GATED", ",views"); }
};

// the op (fused) or upstream's ops as qwen4exp's build_norm_gated makes them
op_graph make_norm(ggml_context * ctx, const norm_case & c, bool fused) {
    ggml_tensor * x_buf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    ggml_tensor * z_buf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n + c.pad, c.rows);
    ggml_tensor * w     = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n);
    ggml_tensor * x     = ggml_view_2d(ctx, x_buf, c.n, c.rows, x_buf->nb[1], 0);
    ggml_tensor * z     = ggml_view_2d(ctx, z_buf, c.n, c.rows, z_buf->nb[1], 0);
    const float   eps   = 1e-6f;
    ggml_tensor * out   = nullptr;
    if (fused) {
        out = pyqsa_ggml_rms_norm_gated(ctx, x, w, z, eps);
    } else {
        ggml_tensor * normed = ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
        out                  = ggml_mul(ctx, normed, ggml_sigmoid(ctx, ggml_cont(ctx, z)));
    }
    return { { x_buf, z_buf, w }, out };
}


// a decode step's mix of hyper-connections: x [n_embd, hc, n_tokens], w_norm [n_embd, hc], w_down
// [hc n_embd, lr], w_inject [hc n_embd, hc], w_up [lr, hc n_embd], the weights of type w (w_up of
// type up where set: a quantized file's, whose w_up rows of 320 have no 256-weight blocks); with
// combine, x is the HC_COMBINE of a block's output [n_embd, n_tokens], the streams before it
// [n_embd, hc, n_tokens] and their scatter logits [hc, n_tokens] (as in the model, where CUDA runs
// the two as one launch)
struct mix_case {
    int64_t   n_embd, hc, lr, n_tokens;
    ggml_type w;
    bool      combine = false;
    bool      gated   = false;  // the combine's block output the MoE's join (hc_combine_gated)
    ggml_type up      = GGML_TYPE_COUNT;

    ggml_type w_up() const { return up == GGML_TYPE_COUNT ? w : up; }

    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "%sHC_DOWN+HC_PRE(n_embd=%lld,hc=%lld,lr=%lld,n_tokens=%lld,%s%s%s)",
                      gated ? "HC_COMBINE(gated)+" : combine ? "HC_COMBINE+" : "", (long long) n_embd, (long long) hc,
                      (long long) lr, (long long) n_tokens, ggml_type_name(w), up == GGML_TYPE_COUNT ? "" : ",up ",
                      up == GGML_TYPE_COUNT ? "" : ggml_type_name(up));
        return buf;
    }

    // the floats of the inputs before the weights: x, or the combine's three (four, gated)
    int64_t n_in() const {
        return n_embd * hc * n_tokens + (combine ? n_embd * n_tokens + hc * n_tokens : 0) +
               (gated ? n_embd * n_tokens + n_tokens : 0);
    }
};

// the two ops (fused) or upstream's graph of the mix as qwen4exp's build_hc_mix makes it; the
// result [n_embd + hc, n_tokens], each token's mixed stream then its scatter logits
op_graph make_mix(ggml_context * ctx, const mix_case & c, bool fused) {
    const int64_t width = c.n_embd * c.hc;
    ggml_tensor * x     = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.n_embd, c.hc, c.n_tokens);
    std::vector<ggml_tensor *> inputs = { x };
    if (c.combine) {
        ggml_tensor * out    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_embd, c.n_tokens);
        ggml_tensor * logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.hc, c.n_tokens);
        inputs               = { out, x, logits };
        if (c.gated) {
            ggml_tensor * joined = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_embd, c.n_tokens);
            ggml_tensor * g      = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, c.n_tokens);
            inputs.insert(inputs.end(), { joined, g });
            x = pyqsa_ggml_hc_combine_gated(ctx, out, joined, g, x, logits, 1.0f / (float) c.hc);
        } else {
            x = pyqsa_ggml_hc_combine(ctx, out, x, logits, 1.0f / (float) c.hc);
        }
    }
    ggml_tensor * w_norm   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_embd, c.hc);
    ggml_tensor * w_down   = ggml_new_tensor_2d(ctx, c.w, width, c.lr);
    ggml_tensor * w_inject = ggml_new_tensor_2d(ctx, c.w, width, c.hc);
    ggml_tensor * w_up     = ggml_new_tensor_2d(ctx, c.w_up(), c.lr, width);
    const float   eps = 1e-6f, inv_hc = 1.0f / (float) c.hc;
    ggml_tensor * mixed  = nullptr;
    ggml_tensor * inject = nullptr;
    if (fused) {
        ggml_tensor * down = pyqsa_ggml_hc_down(ctx, x, w_norm, w_down, w_inject, eps, inv_hc);
        mixed              = pyqsa_ggml_hc_pre(ctx, x, w_norm, w_up, down, inv_hc);
        inject = ggml_view_2d(ctx, down, c.hc, c.n_tokens, c.hc * sizeof(float), c.lr * c.n_tokens * sizeof(float));
    } else {
        ggml_tensor * xn   = ggml_reshape_2d(ctx, ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w_norm), width, c.n_tokens);
        ggml_tensor * lo   = ggml_silu(ctx, ggml_scale(ctx, ggml_mul_mat(ctx, w_down, xn), inv_hc));
        ggml_tensor * gate = ggml_mul_mat(ctx, w_up, lo);
        mixed              = ggml_dsv4_hc_pre_gated(ctx, ggml_reshape_3d(ctx, xn, c.n_embd, c.hc, c.n_tokens),
                                                    ggml_reshape_3d(ctx, gate, c.n_embd, c.hc, c.n_tokens), inv_hc);
        inject             = ggml_mul_mat(ctx, w_inject, xn);
    }
    inputs.insert(inputs.end(), { w_norm, w_down, w_inject, w_up });
    return { inputs, ggml_concat(ctx, mixed, inject, 0) };
}

// x's streams (or the combine's inputs) at several scales (the norm's factor matters), weights ~
// 1 / sqrt(fan-in)
std::vector<float> make_mix_data(const mix_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t width = c.n_embd * c.hc, n_x = c.n_in(), n_norm = width;
    std::vector<float> d(n_x + n_norm + width * c.lr + width * c.hc + c.lr * width);
    for (int64_t i = 0; i < (int64_t) d.size(); ++i) {
        const float s = i < n_x                       ? 0.5f + (float) ((i / c.n_embd) % 4)
                        : i < n_x + n_norm            ? 0.3f
                        : i < n_x + n_norm + width * (c.lr + c.hc) ? 1.0f / std::sqrt((float) width)
                                                                   : 2.0f / std::sqrt((float) c.lr);
        d[i] = (i >= n_x && i < n_x + n_norm ? 1.0f : 0.0f) + s * nd(rng);
    }
    return d;
}

// a decode step's mix against upstream's ops: not bit for bit (the products' sums take f32
// inputs in another order where upstream's CPU products round xn to f16 first), so to rounding on
// each backend, and each other backend's ops against the CPU's
constexpr double MIX_BOUND = 1e-6;
// the same with quantized weights: upstream's products round xn to 8 bits (~3e-5 here), and CUDA's
// mix rounds each dequantized weight to f16 (~1e-7 against the CPU's f32); a wrong block scale
// would give ~1e-2
constexpr double MIX_BOUND_QUANT     = 1e-3;
constexpr double MIX_BOUND_QUANT_CPU = 1e-6;

// another backend's expf (CUDA's fast-math one: ~1e-6 relative at |x| ~ 10) and its contraction
// of the sum into an FMA, against the CPU's; a wrong element would give ~1
constexpr double BOUND = 1e-10;

// how many elements of f differ in their bits from run()'s with the switch `apart` set (a
// backend's fused launch split into the ops' own)
template <typename Run> size_t differ_apart(const char * apart, const std::vector<float> & f, Run && run) {
    setenv(apart, "1", 1);
    const size_t n = bits_differ(f, run());
    unsetenv(apart);
    return n;
}

// an op against upstream's ops: make(ctx, c, fused)'s graph over data on the CPU and on every other
// backend, bit for bit on each, and each other backend's op against the CPU's; with apart, also
// against the ops' own launches there, bit for bit
template <typename Case, typename Make>
void check_fused(const Case & c, const std::vector<float> & data, Make && make, ggml_backend_t cpu,
                 const char * only_backend, int & n_ok, int & n_fail, const char * apart = nullptr) {
    const std::string name = c.name();
    const auto        run  = [&](ggml_backend_t be, bool fused) {
        return run_graph(be, data, [&](ggml_context * ctx) { return make(ctx, c, fused); });
    };
    const std::vector<float> fused = run(cpu, true);
    const size_t             n_cpu = bits_differ(fused, run(cpu, false));
    report(name, "CPU", "vs upstream's ops: " + std::to_string(n_cpu) + " elements differ in their bits ", n_cpu == 0,
           n_ok, n_fail);
    on_other_backends(only_backend, name, n_ok, n_fail, [&](ggml_backend_t be) {
        const std::vector<float> f = run(be, true);
        if (f.empty()) return std::make_pair(false, std::string("not supported "));
        const double e       = nmse(f, fused);
        const size_t n_apart = apart ? differ_apart(apart, f, [&] { return run(be, true); }) : 0;
        const std::string split =
            apart ? "; vs its launches apart: " + std::to_string(n_apart) + " elements differ in their bits" : "";
        if (!upstream_runs_off_cpu(c)) {
            return std::make_pair(e < BOUND && n_apart == 0,
                                  "vs CPU: nmse " + sci(e) + " (upstream's ops do not take this shape there)" + split + " ");
        }
        const size_t n = bits_differ(f, run(be, false));
        return std::make_pair(n == 0 && e < BOUND && n_apart == 0,
                              "vs upstream's ops there: " + std::to_string(n) + " elements differ in their bits; vs CPU: nmse " +
                                  sci(e) + split + " ");
    });
}

void check_mix(const mix_case & c, const std::vector<float> & data, ggml_backend_t cpu, const char * only_backend,
               int & n_ok, int & n_fail) {
    const std::string name = c.name();
    const auto        run  = [&](ggml_backend_t be, bool fused) {
        return run_graph(be, data, [&](ggml_context * ctx) { return make_mix(ctx, c, fused); });
    };
    const bool               quant     = ggml_is_quantized(c.w) || ggml_is_quantized(c.w_up());
    const double             bound     = quant ? MIX_BOUND_QUANT : MIX_BOUND;
    const double             bound_cpu = quant ? MIX_BOUND_QUANT_CPU : BOUND;
    const std::vector<float> fused     = run(cpu, true);
    const double             e_cpu     = nmse(fused, run(cpu, false));
    report(name, "CPU", "vs upstream's ops: nmse " + sci(e_cpu) + " ", e_cpu < bound, n_ok, n_fail);
    on_other_backends(only_backend, name, n_ok, n_fail, [&](ggml_backend_t be) {
        const std::vector<float> f = run(be, true);
        if (f.empty()) return std::make_pair(false, std::string("not supported "));
        const double e = nmse(f, fused), e_up = nmse(f, run(be, false));
        std::string  apart;
        size_t       n_apart = 0;
        if (c.combine) {  // the combine inside hc_down (CUDA) against its own launch: the same bits
            n_apart = differ_apart("PYQSA_CUDA_HC_COMBINE_APART", f, [&] { return run(be, true); });
            apart   = "; vs the combine apart: " + std::to_string(n_apart) + " elements differ in their bits";
        }
        return std::make_pair(e < bound_cpu && e_up < bound && n_apart == 0,
                              "vs CPU: nmse " + sci(e) + "; vs upstream's ops there: nmse " + sci(e_up) + apart + " ");
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
        { 2048, 4, 1, 0, 0, true },  // the MoE's join inside: one sequence, eight, a chunk, views
        { 2048, 4, 8, 0, 0, true },
        { 256, 4, 300, 0, 0, true },
        { 96, 2, 17, 8, 3, true },
    };
    for (const hc_case & c : cases) {
        check_fused(c, make_data(c, rng), make_hc, cpu, only_backend, n_ok, n_fail);
    }
    // the rank of the gate (64 of the model's, a row per token) and odd ones past the SIMD width
    const silu_case silu_cases[] = { { 64, 1, 0 }, { 64, 8, 0 }, { 64, 300, 0 }, { 37, 5, 3 }, { 7, 2, 0 } };
    std::normal_distribution<float> nd(0.0f, 8.0f);
    for (const silu_case & c : silu_cases) {
        std::vector<float> x((c.n + c.pad) * c.rows);
        for (float & v : x) v = nd(rng);
        check_fused(c, x, make_silu, cpu, only_backend, n_ok, n_fail);
    }
    // Flash-Next's 32 value heads at 1 and 8 sequences and a prefill chunk, then odd sizes
    const gates_case gates_cases[] = { { 32, 1, 1, 0 }, { 32, 1, 8, 0 }, { 32, 300, 1, 0 }, { 7, 3, 2, 5 } };
    for (const gates_case & c : gates_cases) {
        check_fused(c, make_gates_data(c, rng), make_gates, cpu, only_backend, n_ok, n_fail);
    }
    // the model's width at 1 and 8 tokens and a chunk, then views and odd sizes
    const add_gated_case add_cases[] = { { 2048, 1, 0 }, { 2048, 8, 0 }, { 256, 300, 0 }, { 37, 5, 3 } };
    std::normal_distribution<float> wide(0.0f, 6.0f);
    for (const add_gated_case & c : add_cases) {
        std::vector<float> v(2 * (c.n + c.pad) * c.rows + (1 + c.pad) * c.rows);
        for (float & e : v) e = wide(rng);
        check_fused(c, v, make_add_gated, cpu, only_backend, n_ok, n_fail);
    }
    // Flash-Next's 8192 channels of 4 taps at 1 and 8 sequences, then odd sizes
    const conv_case conv_cases[] = { { 4, 8192, 1 }, { 4, 8192, 8 }, { 4, 37, 3 }, { 2, 5, 2 }, { 7, 19, 2 } };
    for (const conv_case & c : conv_cases) {
        std::vector<float> v(2 * (c.K - 1) * c.C * c.S + c.C * c.S + c.K * c.C);
        for (float & e : v) e = wide(rng);
        check_fused(c, v, make_conv, cpu, only_backend, n_ok, n_fail);
    }
    // both in one graph: Flash-Next's at 1 and 8 sequences, then views of alpha and beta and odd sizes
    const gates_conv_case gates_conv_cases[] = { { { 32, 1, 1, 0 }, { 4, 8192, 1 } },
                                                 { { 32, 1, 8, 0 }, { 4, 8192, 8 } },
                                                 { { 7, 1, 3, 5 }, { 3, 37, 3 } } };
    for (const gates_conv_case & c : gates_conv_cases) {
        check_fused(c, make_gates_conv_data(c, rng), make_gates_conv, cpu, only_backend, n_ok, n_fail,
                    "PYQSA_CUDA_GDN_CONV_APART");
    }
    // Flash-Next's value heads (128 wide, 32 a token) at 1 and 8 tokens, a chunk, views, a row wider
    // than upstream's one-block cut (1024) and an odd one
    const norm_case norm_cases[] = { { 128, 32, 0 }, { 128, 256, 0 }, { 128, 4096, 0 }, { 64, 9, 5 }, { 1536, 3, 0 },
                                     { 37, 4, 0 } };
    for (const norm_case & c : norm_cases) {
        std::vector<float> v(2 * (c.n + c.pad) * c.rows + c.n);
        for (float & e : v) e = wide(rng);
        check_fused(c, v, make_norm, cpu, only_backend, n_ok, n_fail);
    }
    // Flash-Next's mix (2560 wide, 4 streams, rank 320) at 1 and 8 sequences in f16 and f32, then
    // odd sizes, 3 streams and rank 2, then mixes of a combine's streams (and of the gated one's)
    const mix_case mix_cases[] = { { 2560, 4, 320, 1, GGML_TYPE_F16 }, { 2560, 4, 320, 8, GGML_TYPE_F16 },
                                   { 2560, 4, 320, 1, GGML_TYPE_F32 }, { 2560, 4, 320, 5, GGML_TYPE_F32 },
                                   { 66, 3, 18, 3, GGML_TYPE_F16 },    { 34, 2, 2, 2, GGML_TYPE_F32 },
                                   { 2560, 4, 320, 1, GGML_TYPE_F16, true }, { 2560, 4, 320, 8, GGML_TYPE_F16, true },
                                   { 66, 3, 18, 3, GGML_TYPE_F32, true },
                                   { 2560, 4, 320, 1, GGML_TYPE_F16, true, true },
                                   { 66, 3, 18, 3, GGML_TYPE_F32, true, true },
                                   // quantized files' (one token): Q4_K_M's q4_K with w_up q5_0,
                                   // Q8_0's, Q5_K_M's q5_K with q5_1, Q6_K's q6_K with q8_0
                                   { 2560, 4, 320, 1, GGML_TYPE_Q4_K, false, false, GGML_TYPE_Q5_0 },
                                   { 2560, 4, 320, 1, GGML_TYPE_Q8_0 },
                                   { 2560, 4, 320, 1, GGML_TYPE_Q5_K, true, false, GGML_TYPE_Q5_1 },
                                   { 2560, 4, 320, 1, GGML_TYPE_Q6_K, true, true, GGML_TYPE_Q8_0 } };
    for (const mix_case & c : mix_cases) {
        check_mix(c, make_mix_data(c, rng), cpu, only_backend, n_ok, n_fail);
    }
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

// the microseconds of make(ctx, c, fused)'s graph on be, the op's and upstream's, inputs zero (the
// time does not depend on them)
template <typename Case, typename Make> void time_both(ggml_backend_t be, const Case & c, int iters, Make && make) {
    for (const bool fused : { true, false }) {
        graph_run g;
        ggml_init_params ip = { ctx_size(), nullptr, true };
        g.ctx               = ggml_init(ip);
        if (graph_place(g, be, make(g.ctx, c, fused).out)) {
            ggml_backend_buffer_clear(g.buf, 0);
            std::printf("  %s %s %s: %.1f us/run\n", c.name().c_str(), fused ? "op" : "upstream's ops",
                        ggml_backend_name(be), time_graph(be, g.gf, iters));
        }
    }
}

// Flash-Next's shapes: a decode step of 1 and 8 sequences and a prefill chunk, each op and
// upstream's ops
int cmd_perf(const char * only_backend) {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        ggml_backend_t be    = ggml_backend_dev_init(dev, nullptr);
        const int      iters = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? 5 : 200;
        for (const hc_case & c :
             { hc_case{ 2048, 4, 1, 0, 0 }, hc_case{ 2048, 4, 8, 0, 0 }, hc_case{ 2048, 4, 2048, 0, 0 } }) {
            time_both(be, c, iters, make_hc);
        }
        for (const silu_case & c : { silu_case{ 64, 1, 0 }, silu_case{ 64, 8, 0 }, silu_case{ 64, 2048, 0 } }) {
            time_both(be, c, iters, make_silu);
        }
        for (const gates_case & c :
             { gates_case{ 32, 1, 1, 0 }, gates_case{ 32, 1, 8, 0 }, gates_case{ 32, 2048, 1, 0 } }) {
            time_both(be, c, iters, make_gates);
        }
        for (const add_gated_case & c : { add_gated_case{ 2048, 1, 0 }, add_gated_case{ 2048, 8, 0 },
                                          add_gated_case{ 2048, 2048, 0 } }) {
            time_both(be, c, iters, make_add_gated);
        }
        for (const conv_case & c : { conv_case{ 4, 8192, 1 }, conv_case{ 4, 8192, 8 } }) {
            time_both(be, c, iters, make_conv);
        }
        for (const norm_case & c : { norm_case{ 128, 32, 0 }, norm_case{ 128, 256, 0 }, norm_case{ 128, 65536, 0 } }) {
            time_both(be, c, iters, make_norm);
        }
        for (const mix_case & c :
             { mix_case{ 2560, 4, 320, 1, GGML_TYPE_F16 }, mix_case{ 2560, 4, 320, 8, GGML_TYPE_F16 } }) {
            time_both(be, c, iters, make_mix);
        }
        ggml_backend_free(be);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv, { { "test", cmd_test }, { "perf", cmd_perf } });
}
