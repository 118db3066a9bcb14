// GATED_DELTA_NET as pyqsa runs it on CUDA: prefill batches of the scalar-gate rule with 128-wide
// heads on native/ggml/cuda/gdn-prefill.cu (ggml_patches/0012), the rest (decode, KDA gates,
// other head sizes, unaligned rows) on upstream's kernel; PYQSA_CUDA_GDN_UPSTREAM=1 puts every
// call on upstream's kernel, PYQSA_CUDA_GDN_LANES=32 gives a state column a whole warp. Upstream's
// CPU op against a double-precision recurrence, then every other backend against the CPU, each
// way. `perf` times the ways at Flash-Next's shape.
//
//   test-gdn [test|perf] [-b BACKEND]      exit code 0 when every case passed
#include "op-check.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

// q, k [S, H_qk, T, q_seqs] (a view: each token's rows pad_heads heads apart more, off floats
// into their buffer); v [S, H, T, n_seqs]; g [1 or S (kda), H, T, n_seqs]; beta [1, H, T, n_seqs];
// state [S, S, H, n_seqs]
struct gdn_case {
    int64_t S, H, H_qk, T, n_seqs, q_seqs;
    bool    kda;
    int64_t pad_heads, off;

    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "GATED_DELTA_NET(S=%lld,H=%lld,H_qk=%lld,T=%lld,n_seqs=%lld,q_seqs=%lld%s%s%s)",
                      (long long) S, (long long) H, (long long) H_qk, (long long) T, (long long) n_seqs,
                      (long long) q_seqs, kda ? ",kda" : "", pad_heads ? ",strided" : "", off % 4 ? ",unaligned" : "");
        return buf;
    }
    int64_t q_row_stride() const { return (H_qk + pad_heads) * S; }  // floats from a token's q to the next's
    int64_t q_buf_size() const { return off + q_row_stride() * T * q_seqs; }
    int64_t gate_width() const { return kda ? S : 1; }
};

struct gdn_data {
    std::vector<float> q, k;  // the buffers the views read
    std::vector<float> v, g, beta, s0;
};

gdn_data make_data(const gdn_case & c, std::mt19937 & rng) {
    std::normal_distribution<float>       nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    gdn_data d;
    // q and k rows of unit length, as the model's L2 norm leaves them; decays e^g in (0.37, 1]
    for (std::vector<float> * x : { &d.q, &d.k }) {
        x->assign(c.q_buf_size(), 0.0f);
        for (int64_t r = 0; r < c.T * c.q_seqs * (c.H_qk + c.pad_heads); ++r) {
            float * row = x->data() + c.off + r * c.S;
            double  n2  = 0.0;
            for (int64_t i = 0; i < c.S; ++i) {
                row[i] = nd(rng);
                n2 += (double) row[i] * row[i];
            }
            for (int64_t i = 0; i < c.S; ++i) row[i] = (float) (row[i] / std::sqrt(n2));
        }
    }
    d.v.resize(c.S * c.H * c.T * c.n_seqs);
    d.g.resize(c.gate_width() * c.H * c.T * c.n_seqs);
    d.beta.resize(c.H * c.T * c.n_seqs);
    d.s0.resize(c.S * c.S * c.H * c.n_seqs);
    for (auto & x : d.v) x = nd(rng);
    for (auto & x : d.g) x = -ud(rng);
    for (auto & x : d.beta) x = ud(rng);
    for (auto & x : d.s0) x = 0.1f * nd(rng);
    return d;
}

// the recurrence in double: {outputs [S, H, T, n_seqs], final states [S, S, H, n_seqs]}
std::pair<std::vector<float>, std::vector<float>> reference(const gdn_case & c, const gdn_data & d) {
    const int64_t S = c.S, H = c.H;
    std::vector<float> out(S * H * c.T * c.n_seqs), state(d.s0.size());
    const double scale = 1.0 / std::sqrt((double) S);
    for (int64_t seq = 0; seq < c.n_seqs; ++seq)
    for (int64_t h = 0; h < H; ++h) {
        std::vector<double> s(d.s0.begin() + (seq * H + h) * S * S, d.s0.begin() + (seq * H + h + 1) * S * S);
        const int64_t qs = seq / (c.n_seqs / c.q_seqs), qh = h % c.H_qk;
        for (int64_t t = 0; t < c.T; ++t) {
            const float * q  = d.q.data() + c.off + ((qs * c.T + t) * (c.H_qk + c.pad_heads) + qh) * S;
            const float * k  = d.k.data() + c.off + ((qs * c.T + t) * (c.H_qk + c.pad_heads) + qh) * S;
            const int64_t at = (seq * c.T + t) * H + h;
            const float * g  = d.g.data() + at * c.gate_width();
            for (int64_t j = 0; j < S; ++j) {  // column j of S (s[j * S + i] = S[i][j])
                double kv = 0.0;
                for (int64_t i = 0; i < S; ++i) kv += std::exp((double) g[c.kda ? i : 0]) * s[j * S + i] * k[i];
                const double delta = ((double) d.v[at * S + j] - kv) * d.beta[at];
                double       o     = 0.0;
                for (int64_t i = 0; i < S; ++i) {
                    s[j * S + i] = std::exp((double) g[c.kda ? i : 0]) * s[j * S + i] + k[i] * delta;
                    o += s[j * S + i] * q[i];
                }
                out[at * S + j] = (float) (o * scale);
            }
        }
        for (int64_t i = 0; i < S * S; ++i) state[(seq * H + h) * S * S + i] = (float) s[i];
    }
    return { out, state };
}

struct gdn_tensors {
    ggml_tensor *q_buf, *k_buf, *v, *g, *beta, *s0, *out;
};

gdn_tensors make_gdn(ggml_context * ctx, const gdn_case & c) {
    gdn_tensors t;
    t.q_buf = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.q_buf_size());
    t.k_buf = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.q_buf_size());
    const auto view = [&](ggml_tensor * buf) {
        const size_t nb2 = c.q_row_stride() * sizeof(float);
        return ggml_view_4d(ctx, buf, c.S, c.H_qk, c.T, c.q_seqs, c.S * sizeof(float), nb2, nb2 * c.T, c.off * sizeof(float));
    };
    t.v    = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.S, c.H, c.T, c.n_seqs);
    t.g    = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.gate_width(), c.H, c.T, c.n_seqs);
    t.beta = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, c.H, c.T, c.n_seqs);
    t.s0   = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.S, c.S, c.H, c.n_seqs);
    t.out  = ggml_gated_delta_net(ctx, view(t.q_buf), view(t.k_buf), t.v, t.g, t.beta, t.s0, 1);
    return t;
}

// the tensor headers of one case (9) and its graph
size_t ctx_size() { return ggml_tensor_overhead() * 16 + ggml_graph_overhead(); }

// the op's packed result on be: outputs, then final states; empty when be does not support it
std::vector<float> run(ggml_backend_t be, const gdn_case & c, const gdn_data & d) {
    graph_run g;
    ggml_init_params ip = { ctx_size(), nullptr, true };
    g.ctx               = ggml_init(ip);
    const gdn_tensors t = make_gdn(g.ctx, c);
    if (!graph_place(g, be, t.out)) return {};
    ggml_backend_tensor_set(t.q_buf, d.q.data(), 0, ggml_nbytes(t.q_buf));
    ggml_backend_tensor_set(t.k_buf, d.k.data(), 0, ggml_nbytes(t.k_buf));
    ggml_backend_tensor_set(t.v, d.v.data(), 0, ggml_nbytes(t.v));
    ggml_backend_tensor_set(t.g, d.g.data(), 0, ggml_nbytes(t.g));
    ggml_backend_tensor_set(t.beta, d.beta.data(), 0, ggml_nbytes(t.beta));
    ggml_backend_tensor_set(t.s0, d.s0.data(), 0, ggml_nbytes(t.s0));
    if (ggml_backend_graph_compute(be, g.gf) != GGML_STATUS_SUCCESS) return {};
    std::vector<float> res(ggml_nelements(t.out));
    ggml_backend_tensor_get(t.out, res.data(), 0, ggml_nbytes(t.out));
    return res;
}

// nmse of the outputs and of the final states of a packed result against {outputs, states}
std::pair<double, double> errors(const std::vector<float> & packed, const std::vector<float> & out,
                                 const std::vector<float> & state) {
    if (packed.size() != out.size() + state.size()) return { INFINITY, INFINITY };
    const std::vector<float> o(packed.begin(), packed.begin() + out.size());
    const std::vector<float> s(packed.begin() + out.size(), packed.end());
    return { nmse(o, out), nmse(s, state) };
}

// the ways a CUDA call can run: {variable, value} set for it; the first is pyqsa's default
struct gdn_way {
    const char * var;
    const char * value;
};
const gdn_way WAYS[] = { { nullptr, nullptr }, { "PYQSA_CUDA_GDN_LANES", "32" }, { "PYQSA_CUDA_GDN_UPSTREAM", "1" } };

std::string way_name(const gdn_way & w) {
    return w.var ? std::string(" ") + w.var + "=" + w.value : std::string();
}

constexpr double BOUND = 1e-9;

int cmd_test(const char * only_backend) {
    std::mt19937 rng(97);
    int n_ok = 0, n_fail = 0;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, 4);
    const gdn_case cases[] = {
        { 128, 4, 2, 300, 1, 1, false, 0, 0 },   // prefill: the staged kernel, tiles of 32 and a partial one
        { 128, 4, 2, 70, 3, 3, false, 0, 0 },    // three sequences of 70 tokens
        { 128, 4, 4, 64, 2, 1, false, 0, 0 },    // both sequences read one q/k sequence
        { 128, 4, 2, 96, 1, 1, false, 2, 4 },    // q and k views of a wider buffer (aligned)
        { 128, 4, 2, 96, 1, 1, false, 2, 1 },    // unaligned views: upstream's kernel
        { 128, 4, 2, 8, 4, 4, false, 0, 0 },     // decode-sized: upstream's kernel
        { 128, 4, 2, 40, 2, 2, false, 0, 0 },    // under 64 tokens a sequence: upstream's kernel
        { 64, 4, 2, 100, 1, 1, false, 0, 0 },    // other head size: upstream's kernel
        { 128, 2, 2, 70, 1, 1, true, 0, 0 },     // KDA gate: upstream's kernel
    };
    for (const gdn_case & c : cases) {
        const gdn_data d = make_data(c, rng);
        const auto [out, state] = reference(c, d);
        const std::vector<float> cpu_res = run(cpu, c, d);
        const auto [eo, es] = errors(cpu_res, out, state);
        report(c.name(), "CPU", "vs reference: nmse " + sci(eo) + " (outputs), " + sci(es) + " (states) ",
               eo < BOUND && es < BOUND, n_ok, n_fail);
        const std::vector<float> cpu_out(cpu_res.begin(), cpu_res.begin() + std::min(cpu_res.size(), out.size()));
        const std::vector<float> cpu_state(cpu_res.begin() + cpu_out.size(), cpu_res.end());
        for (const gdn_way & w : WAYS) {
            if (w.var) setenv(w.var, w.value, 1);
            on_other_backends(only_backend, c.name() + way_name(w), n_ok, n_fail, [&](ggml_backend_t be) {
                const std::vector<float> res = run(be, c, d);
                if (res.empty()) return std::make_pair(false, std::string("not supported "));
                const auto [bo, bs] = errors(res, cpu_out, cpu_state);
                return std::make_pair(bo < BOUND && bs < BOUND,
                                      "vs CPU: nmse " + sci(bo) + " (outputs), " + sci(bs) + " (states) ");
            });
            if (w.var) unsetenv(w.var);
        }
    }
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

// Flash-Next's linear-attention layers (32 heads, 16 q/k heads, 128 wide): prefill batches of one
// sequence and a batch of 8 sequences' chunks, each way; inputs zero (the time does not depend on them)
int cmd_perf(const char * only_backend) {
    const gdn_case shapes[] = {
        { 128, 32, 16, 32, 1, 1, false, 0, 0 },   { 128, 32, 16, 64, 1, 1, false, 0, 0 },
        { 128, 32, 16, 512, 1, 1, false, 0, 0 },  { 128, 32, 16, 2048, 1, 1, false, 0, 0 },
        { 128, 32, 16, 256, 8, 8, false, 0, 0 },
    };
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        for (const gdn_case & c : shapes) {
            for (const gdn_way & w : WAYS) {
                if (w.var) setenv(w.var, w.value, 1);
                // a backend a way: CUDA would replay the graph it captured the way before
                ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
                graph_run g;
                ggml_init_params ip = { ctx_size(), nullptr, true };
                g.ctx               = ggml_init(ip);
                const gdn_tensors t = make_gdn(g.ctx, c);
                if (graph_place(g, be, t.out)) {
                    ggml_backend_buffer_clear(g.buf, 0);
                    std::printf("  %s%s %s: %.1f us/run\n", c.name().c_str(), way_name(w).c_str(),
                                ggml_backend_dev_name(dev), time_graph(be, g.gf, 20));
                }
                if (w.var) unsetenv(w.var);
                ggml_backend_free(be);
            }
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv, { { "test", cmd_test }, { "perf", cmd_perf } });
}
