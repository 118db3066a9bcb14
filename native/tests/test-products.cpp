// The matrix products whose CUDA dispatch or precision pyqsa changes: MUL_MAT with f16 weights on
// cuBLAS (ggml_patches/0011, native/ggml/cuda/pyqsa-cuda-precision.h: f32 sums; upstream's f16
// sums with PYQSA_CUDA_F16_ACCUMULATE=1) and MUL_MAT_ID, the MoE expert products: prefill batches
// of f16 experts on pyqsa's grouped GEMM (0013, native/ggml/cuda/moe-gemm.cuh), the rest on MMF's
// device-side expert grouping at every batch (0010, pyqsa-cuda-moe.h; PYQSA_CUDA_MOE_MMF=1 puts
// every call there) and upstream's host-sorted path past 128-512 tokens with PYQSA_CUDA_MOE_SYNC=1.
// Upstream's CPU ops against a double-precision reference, then every other backend against the
// CPU, each way (the grouped GEMM's 64- and 128-row tiles each forced by PYQSA_CUDA_MOE_BM).
// Products of f16 weights with 1-8 columns (decode steps, MUL_MAT and MUL_MAT_ID; MUL_MAT of one column
// a channel too) run on pyqsa's gemv
// (native/ggml/cuda/gemv-f16.cuh): with one column it keeps x in f32, checked against the double
// reference of the unrounded x; with 2-8 it rounds x to f16 as the CPU does, checked against the CPU.
// PYQSA_CUDA_GEMV_UPSTREAM=1 puts them back on upstream's MMVF/MMF.
// Products of one x with other ops between them, run through a scheduler as llama.cpp runs a graph:
// the CUDA backend moves them together and runs them as one launch (native/ggml/cuda/
// product-groups.cuh), each against the CPU, the launches counted, and against the same graph
// with PYQSA_CUDA_PRODUCTS_UNGROUPED=1, bit for bit where the one-column gemv takes each product
// alone too (at 2-8 columns the launch's rows pick its warps a CTA and K's split, so a product's
// sums may differ grouped and alone).
// `perf` times each way at prefill batches and decode steps.
//
//   test-products [test|perf] [-b BACKEND]      exit code 0 when every case passed
#include "op-check.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

// MUL_MAT_ID: dst [n_out, n_used, n_tok] = expert ids[i, t] of w [n_in, n_out, n_expert] times
// x [n_in, n_x, n_tok], x's row i % n_x (n_x = 1: gate and up read one row per token; n_used: down
// reads one per expert). n_expert = 0: MUL_MAT, dst [n_out, n_tok] = w [n_in, n_out] times
// x [n_in, n_tok] (n_used = n_x = 1).
struct product_case {
    ggml_type type;
    int64_t   n_in, n_out, n_expert, n_used, n_tok, n_x;
    bool      skewed;                 // most tokens on two experts, some experts on none
    bool      per_channel = false;    // MUL_MAT of x [n_in, 1, n_tok], w broadcast: dst [n_out, 1, n_tok]

    std::string name() const {
        char buf[160];
        if (n_expert == 0) {
            std::snprintf(buf, sizeof(buf), "MUL_MAT(type=%s,n_in=%lld,n_out=%lld,n_tok=%lld%s)", ggml_type_name(type),
                          (long long) n_in, (long long) n_out, (long long) n_tok, per_channel ? ",per channel" : "");
            return buf;
        }
        std::snprintf(buf, sizeof(buf), "MUL_MAT_ID(type=%s,n_in=%lld,n_out=%lld,n_expert=%lld,n_used=%lld,n_tok=%lld,n_x=%lld%s)",
                      ggml_type_name(type), (long long) n_in, (long long) n_out, (long long) n_expert,
                      (long long) n_used, (long long) n_tok, (long long) n_x, skewed ? ",skewed" : "");
        return buf;
    }
};

struct product_data {
    std::vector<uint8_t> w_raw;   // encoded as the case's type
    std::vector<float>   w, x;    // w decoded; x as uploaded
    std::vector<int32_t> ids;     // [n_used, n_tok], distinct experts per token
};

// each token's n_used experts, distinct; skewed: 7 tokens in 8 on experts 0..n_used, the rest on
// the lower half, so the upper half gets none (MUL_MAT: all 0, its one matrix)
std::vector<int32_t> draw_ids(const product_case & c, std::mt19937 & rng) {
    std::vector<int32_t> ids(c.n_used * c.n_tok, 0);
    if (c.n_expert == 0) return ids;
    for (int64_t t = 0; t < c.n_tok; ++t) {
        const int64_t pool = !c.skewed ? c.n_expert : rng() % 8 ? c.n_used + 1 : c.n_expert / 2;
        for (int64_t i = 0; i < c.n_used; ++i) {
            int32_t e     = 0;
            bool    fresh = false;
            while (!fresh) {
                e     = (int32_t) (rng() % pool);
                fresh = true;
                for (int64_t j = 0; j < i; ++j) fresh = fresh && ids[t * c.n_used + j] != e;
            }
            ids[t * c.n_used + i] = e;
        }
    }
    return ids;
}

product_data make_data(const product_case & c, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    product_data d;
    d.w.resize(c.n_in * c.n_out * std::max<int64_t>(c.n_expert, 1));
    d.x.resize(c.n_in * c.n_x * c.n_tok);
    for (auto & v : d.w) v = nd(rng);
    for (auto & v : d.x) v = nd(rng);
    d.w_raw.resize(ggml_row_size(c.type, c.n_in) * c.n_out * std::max<int64_t>(c.n_expert, 1));
    const auto * traits = ggml_get_type_traits(c.type);
    ggml_get_type_traits_cpu(c.type)->from_float(d.w.data(), d.w_raw.data(), (int64_t) d.w.size());
    traits->to_float(d.w_raw.data(), d.w.data(), (int64_t) d.w.size());
    d.ids = draw_ids(c, rng);
    return d;
}

// the products in double, x rounded to x_type first (GGML_TYPE_F32: x as it is); the CPU backend
// rounds x to f16 and bf16 weights' own type
std::vector<float> reference(const product_case & c, const product_data & d, ggml_type x_type) {
    std::vector<float> xr(d.x);
    if (x_type != GGML_TYPE_F32) {
        std::vector<uint8_t> tmp(ggml_row_size(x_type, (int64_t) d.x.size()));
        ggml_get_type_traits_cpu(x_type)->from_float(d.x.data(), tmp.data(), (int64_t) d.x.size());
        ggml_get_type_traits(x_type)->to_float(tmp.data(), xr.data(), (int64_t) d.x.size());
    }
    std::vector<float> out(c.n_out * c.n_used * c.n_tok);
    for (int64_t t = 0; t < c.n_tok; ++t)
    for (int64_t i = 0; i < c.n_used; ++i) {
        const float * w = d.w.data() + d.ids[t * c.n_used + i] * c.n_in * c.n_out;
        const float * x = xr.data() + (t * c.n_x + i % c.n_x) * c.n_in;
        for (int64_t o = 0; o < c.n_out; ++o) {
            double acc = 0.0;
            for (int64_t k = 0; k < c.n_in; ++k) acc += (double) w[o * c.n_in + k] * x[k];
            out[(t * c.n_used + i) * c.n_out + o] = (float) acc;
        }
    }
    return out;
}

// the case's inputs and its product; ids only for MUL_MAT_ID
struct product_tensors {
    ggml_tensor *w = nullptr, *x = nullptr, *ids = nullptr, *out = nullptr;
};

product_tensors make_product(ggml_context * ctx, const product_case & c) {
    product_tensors t;
    if (c.n_expert == 0) {  // per channel: the same bytes, x's columns along dim 2
        t.w   = ggml_new_tensor_2d(ctx, c.type, c.n_in, c.n_out);
        t.x   = c.per_channel ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.n_in, 1, c.n_tok)
                              : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_in, c.n_tok);
        t.out = ggml_mul_mat(ctx, t.w, t.x);
    } else {
        t.w   = ggml_new_tensor_3d(ctx, c.type, c.n_in, c.n_out, c.n_expert);
        t.x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.n_in, c.n_x, c.n_tok);
        t.ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.n_used, c.n_tok);
        t.out = ggml_mul_mat_id(ctx, t.w, t.x, t.ids);
    }
    return t;
}

std::vector<float> run(ggml_backend_t be, const product_case & c, const product_data & d, bool * supported) {
    product_tensors t;
    const auto make = [&](ggml_context * ctx) {
        t = make_product(ctx, c);
        return std::make_pair(t.w, t.out);
    };
    const auto upload = [&](ggml_tensor *) {
        ggml_backend_tensor_set(t.w, d.w_raw.data(), 0, ggml_nbytes(t.w));
        ggml_backend_tensor_set(t.x, d.x.data(), 0, ggml_nbytes(t.x));
        if (t.ids) ggml_backend_tensor_set(t.ids, d.ids.data(), 0, ggml_nbytes(t.ids));
    };
    return run_op<float>(be, make, upload, supported);
}

// the ways CUDA can run a case: {variable, value set for it, its bound, against what: the CPU
// (GGML_TYPE_COUNT) or the reference of x rounded to that type (GGML_TYPE_F32: unrounded)}, pyqsa's
// own first (no variable). f16 sums (MUL_MAT of f16 weights, upstream's way; upstream's MMVF at one
// column too) and x in 8 bits (quantized weights on the CPU and on upstream's MMVQ) meet only a
// loose bound, enough to catch a wrong row or expert.
struct product_way {
    const char * var;
    const char * value;
    double       bound;
    ggml_type    ref_x = GGML_TYPE_COUNT;
};

// a decode step's product: f16 weights, 1-8 columns (the gemv's, but for narrow one-column
// MUL_MATs)
bool decode_step(const product_case & c) {
    return c.type == GGML_TYPE_F16 && c.n_tok <= 8;
}

// x as the gemv takes it with quantized weights: f32 at one column, rounded to f16 at 2-8
ggml_type gemv_x_type(int64_t n_tok) {
    return n_tok == 1 ? GGML_TYPE_F32 : GGML_TYPE_F16;
}

// the CPU backend's products of quantized weights round x to 8 bits (q8_0, q8_K): against the
// reference of the unrounded x within 1e-3 (~2e-5 here), where a wrong block scale is ~0.1
bool quantized(const product_case & c) {
    return ggml_is_quantized(c.type);
}

// the gemv's one-column share that keeps x in f32: MUL_MATs wide enough for it on a GPU of up to
// 256 SMs (the narrower ones stay on upstream's MMVF, which sums in f16) and one token's experts
bool one_column_f32_x(const product_case & c) {
    return decode_step(c) && c.n_tok == 1 && (c.n_expert > 0 || c.n_out >= 8192);
}

// q4_K, q5_K and q6_K (2 and 4 chunks a lane-step) with one chunk a lane-step too; a dense MUL_MAT of 2-8
// columns in each form of the gemv's cols kernel (gemv-f16.cu cols_forms), forced. Each held to
// `ours`'s bound: the ways differ only in the order the K shares are added
void add_gemv_forms(const product_case & c, const product_way & ours, std::vector<product_way> & ws) {
    if (c.type == GGML_TYPE_Q4_K || c.type == GGML_TYPE_Q5_K || c.type == GGML_TYPE_Q6_K) {
        ws.push_back({ "PYQSA_CUDA_GEMV_ONE_CHUNK", "1", ours.bound, ours.ref_x });
    }
    if (c.n_expert > 0 || c.n_tok < 2 || c.n_tok > 8 || c.per_channel) {
        return;
    }
    for (const char * form : { "8,1", "8,2", "4,1", "4,2", "4,4" }) {
        ws.push_back({ "PYQSA_CUDA_GEMV_FORM", form, ours.bound, ours.ref_x });
    }
}

std::vector<product_way> ways(const product_case & c) {
    if (quantized(c)) {
        // the gemv's (gemv-weights.cuh: each weight rounded to f16 once, ~1e-7 here; a quant one off
        // in a q8_0 block is ~4e-4) where it takes the case: x in f32 at one column (wide MUL_MATs and
        // experts), rounded to f16 at 2-8; upstream's MMVQ rounds x to 8 bits
        const bool gemv = c.n_tok >= 2 || c.n_expert > 0 || c.n_out >= 8192;
        const product_way ours = gemv ? product_way{ nullptr, nullptr, 1e-6, gemv_x_type(c.n_tok) }
                                      : product_way{ nullptr, nullptr, 1e-3 };
        std::vector<product_way> ws = { ours, { "PYQSA_CUDA_GEMV_UPSTREAM", "1", 1e-3 } };
        add_gemv_forms(c, ours, ws);
        return ws;
    }
    if (one_column_f32_x(c)) {
        return { { nullptr, nullptr, 1e-10, GGML_TYPE_F32 }, { "PYQSA_CUDA_GEMV_UPSTREAM", "1", 1e-4 } };
    }
    if (decode_step(c) && c.n_tok >= 2) {  // upstream's per-channel products: MMVF, f16 sums
        const product_way        ours = { nullptr, nullptr, 1e-9 };
        std::vector<product_way> ws   = { ours, { "PYQSA_CUDA_GEMV_UPSTREAM", "1", c.per_channel ? 1e-3 : 1e-9 } };
        add_gemv_forms(c, ours, ws);
        return ws;
    }
    if (c.n_expert == 0) {
        return { { nullptr, nullptr, 1e-9 }, { "PYQSA_CUDA_F16_ACCUMULATE", "1", c.type == GGML_TYPE_F16 ? 1e-3 : 1e-9 } };
    }
    // the grouped GEMM's two tile heights, each forced, where it takes the case
    return { { nullptr, nullptr, 1e-9 },           { "PYQSA_CUDA_MOE_BM", "64", 1e-9 },
             { "PYQSA_CUDA_MOE_BM", "128", 1e-9 }, { "PYQSA_CUDA_MOE_MMF", "1", 1e-9 },
             { "PYQSA_CUDA_MOE_SYNC", "1", 1e-9 } };
}

std::string way_name(const product_way & w) {
    return w.var ? std::string(" ") + w.var + "=" + w.value : "";
}

// MUL_MATs y_i = w_i x (weights [n_in, n_out[i]] of types[i], f16 where types is empty; x
// [n_in, n_tok]), each scaled by 1 right after it (a node between the products, as a decode step
// has); hazard: x scaled in place after the first product, so the second and later ones read the
// scaled x and must not move before it
struct group_case {
    int64_t                n_in;
    std::vector<int64_t>   n_out;
    int64_t                n_tok;
    bool                   hazard;
    bool                   same_bits;     // every product on the one-column gemv alone too, summed alike
    int                    launches;      // grouped launches the graph makes
    std::vector<ggml_type> types   = {};
    int                    grouped = -1;  // the products they take: all (but a hazard's first) if -1

    ggml_type type(size_t i) const { return types.empty() ? GGML_TYPE_F16 : types[i]; }

    std::string name() const {
        std::string outs;
        for (size_t i = 0; i < n_out.size(); ++i) {
            const std::string t = types.empty() ? "" : std::string(":") + ggml_type_name(type(i));
            outs += (i ? "," : "") + std::to_string(n_out[i]) + t;
        }
        return "MUL_MAT group(n_in=" + std::to_string(n_in) + ",n_out=" + outs + ",n_tok=" + std::to_string(n_tok) +
               (hazard ? ",x written between" : "") + ")";
    }
};

// the group's outputs, concatenated, computed on be (and the CPU) by a scheduler; counts: the
// backend's grouped launches and products during the compute, when it counts them
std::vector<float> run_group(ggml_backend_t be, ggml_backend_t cpu, const group_case & c,
                             const std::vector<product_data> & w, const std::vector<float> & x,
                             uint64_t counts[2]) {
    const size_t   n = c.n_out.size();
    ggml_init_params pp = { ggml_tensor_overhead() * (n + 1), nullptr, true };
    ggml_context * params = ggml_init(pp);
    std::vector<ggml_tensor *> wt(n);
    for (size_t i = 0; i < n; ++i) wt[i] = ggml_new_tensor_2d(params, c.type(i), c.n_in, c.n_out[i]);
    ggml_tensor * xt = ggml_new_tensor_2d(params, GGML_TYPE_F32, c.n_in, c.n_tok);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(params, be);
    for (size_t i = 0; i < n; ++i) ggml_backend_tensor_set(wt[i], w[i].w_raw.data(), 0, ggml_nbytes(wt[i]));
    ggml_backend_tensor_set(xt, x.data(), 0, ggml_nbytes(xt));

    ggml_init_params gp = { ggml_tensor_overhead() * (3 * n + 8) + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(gp);
    ggml_cgraph *  gf  = ggml_new_graph(ctx);
    std::vector<ggml_tensor *> outs;
    for (size_t i = 0; i < n; ++i) {
        ggml_tensor * y = ggml_scale(ctx, ggml_mul_mat(ctx, wt[i], xt), 1.0f);
        ggml_set_output(y);
        ggml_build_forward_expand(gf, y);
        outs.push_back(y);
        if (c.hazard && i == 0) ggml_build_forward_expand(gf, ggml_scale_inplace(ctx, xt, 0.5f));
    }
    ggml_backend_t backends[2] = { be, cpu };
    const bool     same        = be == cpu;
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends + (same ? 1 : 0), nullptr, same ? 1 : 2,
                                                        GGML_DEFAULT_GRAPH_SIZE, false, false);
    using counts_fn = void (*)(uint64_t *);
    ggml_backend_reg_t reg    = ggml_backend_dev_backend_reg(ggml_backend_get_device(be));
    auto               count  = (counts_fn) ggml_backend_reg_get_proc_address(reg, "pyqsa_cuda_group_counts");
    uint64_t           before[2] = { 0, 0 }, after[2] = { 0, 0 };
    if (!count) {  // a backend that groups nothing
        count = [](uint64_t * out) { out[0] = out[1] = 0; };
    }
    count(before);
    const bool ok = ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS;
    ggml_backend_sched_synchronize(sched);
    count(after);
    counts[0] = after[0] - before[0];
    counts[1] = after[1] - before[1];
    std::vector<float> res;
    for (ggml_tensor * y : outs) {
        const size_t off = res.size();
        res.resize(off + ggml_nelements(y));
        if (ok) ggml_backend_tensor_get(y, res.data() + off, 0, ggml_nbytes(y));
    }
    if (!ok) res.clear();
    ggml_backend_sched_free(sched);
    ggml_free(ctx);
    ggml_backend_buffer_free(buf);
    ggml_free(params);
    return res;
}

void check_groups(const char * only_backend, ggml_backend_t cpu, std::mt19937 & rng, int & n_ok, int & n_fail) {
    // Flash-Next's projections of one input: the linear attention's qkv, alpha, beta and z, the
    // attention's q and gate, k, v and the indexer's q and k, a hyper-connection norm's down and
    // inject (at one column too few rows for two a warp: not grouped); rows not a multiple of a
    // warp's, the most products a launch takes; a quantized file's (Q4_K_M: q4_K beside a q6_K
    // and a q5_0 one, each type its own launch; Q8_0)
    constexpr ggml_type q4_K = GGML_TYPE_Q4_K, q6_K = GGML_TYPE_Q6_K, q5_0 = GGML_TYPE_Q5_0, q8_0 = GGML_TYPE_Q8_0;
    const group_case cases[] = {
        { 2560, { 4096, 1024, 8192, 1024 }, 1, false, false, 1, { q4_K, q4_K, q6_K, q4_K }, 3 },
        { 2560, { 4096, 1024, 8192, 1024 }, 8, false, false, 1, { q4_K, q4_K, q6_K, q4_K }, 3 },
        { 2560, { 4096, 4096, 512, 512, 32 }, 2, false, false, 2, { q4_K, q5_0, q4_K, q5_0, q4_K }, 5 },
        { 2560, { 12288, 512, 512, 512, 128 }, 1, false, false, 1, { q8_0, q8_0, q8_0, q8_0, q8_0 } },
        { 2560, { 8192, 32, 8192 }, 4, true, false, 1, { q8_0, q8_0, q8_0 } },
        { 2560, { 12288, 8192, 8192 }, 1, false, true, 1 },
        { 2560, { 8192, 32, 32, 4096 }, 1, false, false, 1 },
        { 2560, { 12288, 512, 512, 512, 128 }, 1, false, false, 1 },
        { 10240, { 16, 4 }, 1, false, false, 0 },
        { 10240, { 16, 4 }, 8, false, false, 1 },
        { 256, { 33, 1, 7, 100, 64, 5, 17, 4100 }, 1, false, false, 1 },
        { 256, { 33, 1, 7, 100, 64, 5, 17, 9 }, 2, false, false, 1 },
        { 2560, { 12288, 512, 512, 512, 128 }, 8, false, false, 1 },
        { 2560, { 8192, 32, 4096 }, 3, false, false, 1 },
        { 2560, { 8192, 32, 8192 }, 1, true, false, 1 },
    };
    for (const group_case & c : cases) {
        // each product's weights and the case's reference (make_data, reference), all on one x,
        // halved past the first product where x is scaled in place between
        // quantized: the CPU rounds x to 8 bits (within 1e-3 of the reference), the gemv takes x in
        // f32 at one column and in f16 at 2-8 (within 1e-6 of that reference, not of the CPU)
        const bool quant = !c.types.empty() && ggml_is_quantized(c.types[0]);
        std::vector<product_data> w;
        std::vector<float>        x, ref, ref_gemv;
        for (size_t i = 0; i < c.n_out.size(); ++i) {
            const product_case pc = { c.type(i), c.n_in, c.n_out[i], 0, 1, c.n_tok, 1, false };
            w.push_back(make_data(pc, rng));
            if (x.empty()) x = w.back().x;
            product_data d = w.back();
            d.x            = x;
            for (auto & v : d.x) v *= c.hazard && w.size() > 1 ? 0.5f : 1.0f;
            const std::vector<float> r = reference(pc, d, quant ? GGML_TYPE_F32 : pc.type);
            ref.insert(ref.end(), r.begin(), r.end());
            if (quant) {
                const std::vector<float> rg = reference(pc, d, gemv_x_type(c.n_tok));
                ref_gemv.insert(ref_gemv.end(), rg.begin(), rg.end());
            }
        }
        uint64_t counts[2];
        const std::vector<float> out_cpu = run_group(cpu, cpu, c, w, x, counts);
        const double e_cpu = nmse(out_cpu, ref);
        report(c.name(), "CPU", "vs reference: nmse " + sci(e_cpu) + " ", e_cpu < (quant ? 1e-3 : 1e-9), n_ok, n_fail);
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            uint64_t grouped[2], alone[2];
            const std::vector<float> out = run_group(be, cpu, c, w, x, grouped);
            setenv("PYQSA_CUDA_PRODUCTS_UNGROUPED", "1", 1);
            const std::vector<float> out_alone = run_group(be, cpu, c, w, x, alone);
            unsetenv("PYQSA_CUDA_PRODUCTS_UNGROUPED");
            // f16 x rounding (2-8 columns) and upstream's f16 sums (narrow ones alone) against
            // f32 x and sums: within 1e-6, where a wrong row or part is ~1
            const double e       = nmse(out, quant ? ref_gemv : out_cpu);
            const bool   bits    = out.size() == out_alone.size() && !out.empty() &&
                                   std::memcmp(out.data(), out_alone.data(), out.size() * sizeof(float)) == 0;
            const int    n_all   = c.hazard ? (int) c.n_out.size() - 1 : (int) c.n_out.size();
            const int    n_group = c.grouped >= 0 ? c.grouped : n_all;
            const bool   counted = grouped[0] == (uint64_t) c.launches &&
                                   grouped[1] == (uint64_t) (c.launches ? n_group : 0) && alone[0] == 0;
            const bool ok = !out.empty() && e < 1e-6 && counted && (!c.same_bits || bits);
            char detail[200];
            std::snprintf(detail, sizeof(detail), "vs %s: nmse %s, %llu launch(es) of %llu products, %s ",
                          quant ? "reference" : "CPU", sci(e).c_str(),
                          (unsigned long long) grouped[0], (unsigned long long) grouped[1],
                          bits ? "same bits ungrouped" : "other bits ungrouped");
            return std::make_pair(ok, std::string(detail));
        });
    }
}

int cmd_test(const char * only_backend) {
    std::mt19937 rng(4321);
    int n_ok = 0, n_fail = 0;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, 4);
    const product_case cases[] = {
        // MUL_MAT past MMF's 16 columns (cuBLAS on CUDA)
        { GGML_TYPE_F16, 2560, 512, 0, 1, 520, 1, false },
        { GGML_TYPE_F16, 1024, 1024, 0, 1, 37, 1, false },
        { GGML_TYPE_BF16, 512, 256, 0, 1, 300, 1, false },
        // MUL_MAT_ID past upstream's MMF limits (512 tokens for gate/up, 128 for down) and under them
        { GGML_TYPE_F16, 2560, 512, 8, 2, 1030, 1, false },  // Flash-Next's gate/up and down
        { GGML_TYPE_F16, 512, 2560, 8, 2, 300, 2, false },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 600, 1, true },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 200, 2, true },
        { GGML_TYPE_F16, 256, 64, 16, 4, 700, 4, false },   // 4 used, each with its own input row
        { GGML_TYPE_F16, 256, 128, 16, 4, 700, 4, false },  // the same on the grouped GEMM
        { GGML_TYPE_F16, 128, 256, 64, 6, 900, 1, true },   // 64 experts, half of them idle
        { GGML_TYPE_BF16, 512, 128, 8, 2, 1030, 1, false },
        { GGML_TYPE_F16, 128, 64, 4, 2, 37, 1, false },     // under every limit: the same kernel both ways
        // decode steps of one sequence: Flash-Next's projections (2 and 4 rows a warp; rows past a
        // warp's share at 8452) and experts (each used one with an input row of its own too)
        { GGML_TYPE_F16, 2560, 8192, 0, 1, 1, 1, false },
        { GGML_TYPE_F16, 2560, 12288, 0, 1, 1, 1, false },
        { GGML_TYPE_F16, 512, 8452, 0, 1, 1, 1, false },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 1, 2, false },
        { GGML_TYPE_F16, 128, 256, 64, 6, 1, 1, false },
        // 2-8 columns, each form the gemv picks on a 132-SM card (gemv-f16.cu cols_form_of; n_in x
        // n_out): 4 warps a CTA (2560 x 12288), 8 (512 x 2560; rows past a CTA's at 128 x 33), K
        // over clusters of 2 (6144 x 2560), 4 (2560 x 1024) and 8 (a hyper-connection norm's down
        // and inject, 10240 x 324); experts with one to all tokens, 64 experts fewer than the
        // slots, 4 warps of 32 rows (512 x 2560, 128 x 256), 2 warps of 32 rows (1024 x 512, 64
        // experts top-8) and of 64 (512 x 1024)
        { GGML_TYPE_F16, 2560, 12288, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 512, 2560, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 6144, 2560, 0, 1, 5, 1, false },
        { GGML_TYPE_F16, 2560, 1024, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 10240, 324, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 128, 33, 0, 1, 2, 1, false },
        // the linear attention's output projection at 8 and 3 sequences: one column a channel
        { GGML_TYPE_F16, 4096, 2560, 0, 1, 8, 1, false, true },
        { GGML_TYPE_F16, 512, 33, 0, 1, 3, 1, false, true },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 8, 1, false },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 8, 2, false },
        { GGML_TYPE_F16, 256, 64, 16, 4, 7, 4, true },
        { GGML_TYPE_F16, 128, 256, 64, 6, 8, 1, false },
        { GGML_TYPE_F16, 1024, 512, 64, 8, 8, 1, false },
        { GGML_TYPE_F16, 512, 1024, 64, 8, 8, 8, false },
        // quantized weights (gemv-weights.cuh), the types of pyqsa quantize's files: Q4_K_M's q4_K
        // and q6_K, Q5_K_M's q5_K, Q8_0's (and the GDN gates') q8_0. Decode steps of one sequence
        // (a wide MUL_MAT, the experts; a narrow MUL_MAT stays on MMVQ) and of 2-8: 4 warps a CTA,
        // K over clusters of 4 and 8 (each CTA's share starting inside a 256-weight block), experts
        // skewed, q8_0 rows of K not a multiple of 256 (rows past a CTA's)
        { GGML_TYPE_Q4_K, 2560, 12288, 0, 1, 1, 1, false },
        { GGML_TYPE_Q4_K, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_Q4_K, 512, 2560, 8, 2, 1, 2, false },
        { GGML_TYPE_Q4_K, 2560, 4096, 0, 1, 1, 1, false },
        { GGML_TYPE_Q4_K, 2560, 12288, 0, 1, 8, 1, false },
        { GGML_TYPE_Q4_K, 2560, 1024, 0, 1, 8, 1, false },
        { GGML_TYPE_Q4_K, 2560, 512, 8, 2, 8, 1, false },
        { GGML_TYPE_Q4_K, 512, 2560, 8, 2, 7, 2, true },
        { GGML_TYPE_Q5_K, 10240, 324, 0, 1, 8, 1, false },
        { GGML_TYPE_Q5_K, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_Q5_K, 512, 2560, 8, 2, 4, 2, false },
        { GGML_TYPE_Q6_K, 2560, 8192, 0, 1, 1, 1, false },
        { GGML_TYPE_Q6_K, 512, 2560, 8, 2, 1, 2, false },
        { GGML_TYPE_Q6_K, 2560, 8192, 0, 1, 8, 1, false },
        { GGML_TYPE_Q6_K, 512, 2560, 8, 2, 8, 2, false },
        { GGML_TYPE_Q8_0, 2560, 8192, 0, 1, 1, 1, false },
        { GGML_TYPE_Q8_0, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_Q8_0, 2560, 12288, 0, 1, 8, 1, false },
        { GGML_TYPE_Q8_0, 1056, 300, 0, 1, 5, 1, false },
        { GGML_TYPE_Q8_0, 512, 2560, 8, 2, 8, 2, false },
        // the 32-weight blocks: Q4_K_M's q5_0 (a hyper-connection's up projection, K = 320: no
        // 256-weight blocks), Q4_0 and Q5_0 files' and the _1 forms
        { GGML_TYPE_Q5_0, 320, 10240, 0, 1, 1, 1, false },
        { GGML_TYPE_Q5_0, 320, 10240, 0, 1, 8, 1, false },
        { GGML_TYPE_Q4_0, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_Q4_0, 2560, 1024, 0, 1, 6, 1, false },
        { GGML_TYPE_Q4_1, 2560, 8192, 0, 1, 1, 1, false },
        { GGML_TYPE_Q4_1, 512, 2560, 8, 2, 8, 2, false },
        { GGML_TYPE_Q5_1, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_Q5_1, 1056, 300, 0, 1, 3, 1, false },
    };
    for (const product_case & c : cases) {
        const product_data d = make_data(c, rng);
        const std::vector<float> ref = reference(c, d, quantized(c) ? GGML_TYPE_F32 : c.type);
        bool supported = false;
        const std::vector<float> out_cpu = run(cpu, c, d, &supported);
        const double e_cpu = supported ? nmse(out_cpu, ref) : INFINITY;
        const double cpu_bound = quantized(c) ? 1e-3 : 1e-9;
        report(c.name(), "CPU", "vs reference: nmse " + sci(e_cpu) + " ", supported && e_cpu < cpu_bound, n_ok, n_fail);
        for (const product_way & w : ways(c)) {
            if (w.var) setenv(w.var, w.value, 1);
            on_other_backends(only_backend, c.name() + way_name(w), n_ok, n_fail, [&](ggml_backend_t be) {
                bool ok = false;
                const std::vector<float> out = run(be, c, d, &ok);
                const bool        vs_cpu = w.ref_x == GGML_TYPE_COUNT;
                const double      e      = !ok ? INFINITY : nmse(out, vs_cpu ? out_cpu : reference(c, d, w.ref_x));
                const std::string against = vs_cpu ? std::string("vs CPU: nmse ")
                                                   : std::string("vs reference of x in ") + ggml_type_name(w.ref_x) +
                                                         ": nmse ";
                return std::make_pair(ok && e < w.bound, ok ? against + sci(e) + " " : std::string("not supported "));
            });
            if (w.var) unsetenv(w.var);
        }
    }
    check_groups(only_backend, cpu, rng, n_ok, n_fail);
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

double weight_bytes_read(const product_case & c, const std::vector<int32_t> & ids) {
    std::vector<bool> used(std::max<int64_t>(c.n_expert, 1), false);
    for (int32_t e : ids) used[e] = true;
    return (double) ggml_row_size(c.type, c.n_in) * c.n_out * (double) std::count(used.begin(), used.end(), true);
}

// products of a prefill batch or a decode step, each way; weights zero (a product's time does not depend on its
// values), experts drawn at random per token
int cmd_perf(const char * only_backend) {
    std::mt19937 rng(5);
    const product_case shapes[] = {
        // Flash-Next's dense projections (hidden 2560; 12288 = the attention's q and gate, or the
        // linear attention's q, k, v and z), a 2048-token batch
        { GGML_TYPE_F16, 2560, 12288, 0, 1, 2048, 1, false },
        { GGML_TYPE_F16, 8192, 2560, 0, 1, 2048, 1, false },
        // Flash-Next's experts (8 experts of 512, 2 used): gate/up, down
        { GGML_TYPE_F16, 2560, 512, 8, 2, 2048, 1, false },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 2048, 2, false },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 512, 1, false },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 512, 2, false },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 128, 1, false },
        // many small experts (512 of 512, 10 used, hidden 2048), as the larger Qwen MoE models have
        { GGML_TYPE_F16, 2048, 512, 512, 10, 2048, 1, false },
        { GGML_TYPE_F16, 512, 2048, 512, 10, 2048, 10, false },
        // decode steps of 1 and 8 sequences: Flash-Next's widest projections, the linear
        // attention's output, the shared expert's gate and up, a hyper-connection norm's down and
        // inject, the 8 experts and the real model's 512 (top-10), the output layer
        { GGML_TYPE_F16, 2560, 8192, 0, 1, 1, 1, false },
        { GGML_TYPE_F16, 2560, 12288, 0, 1, 1, 1, false },
        { GGML_TYPE_F16, 2560, 151936, 0, 1, 1, 1, false },
        { GGML_TYPE_F16, 2560, 12288, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 4096, 2560, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 2560, 1024, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 10240, 324, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 2560, 151936, 0, 1, 8, 1, false },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 8, 1, false },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 8, 2, false },
        { GGML_TYPE_F16, 2560, 512, 512, 10, 8, 1, false },
        { GGML_TYPE_F16, 512, 2560, 512, 10, 8, 10, false },
        { GGML_TYPE_F16, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_F16, 512, 2560, 8, 2, 1, 2, false },
        { GGML_TYPE_F16, 2560, 512, 512, 10, 1, 1, false },
        // the same decode steps of quantized weights: Q4_K_M's q4_K and q6_K, Q8_0's q8_0
        { GGML_TYPE_Q4_K, 2560, 12288, 0, 1, 1, 1, false },
        { GGML_TYPE_Q4_K, 2560, 12288, 0, 1, 8, 1, false },
        { GGML_TYPE_Q4_K, 2560, 1024, 0, 1, 8, 1, false },
        { GGML_TYPE_Q4_K, 2560, 512, 8, 2, 1, 1, false },
        { GGML_TYPE_Q4_K, 2560, 512, 8, 2, 8, 1, false },
        { GGML_TYPE_Q6_K, 512, 2560, 8, 2, 8, 2, false },
        { GGML_TYPE_Q6_K, 2560, 151936, 0, 1, 1, 1, false },
        { GGML_TYPE_Q6_K, 2560, 151936, 0, 1, 8, 1, false },
        { GGML_TYPE_Q8_0, 2560, 12288, 0, 1, 1, 1, false },
        { GGML_TYPE_Q8_0, 2560, 12288, 0, 1, 8, 1, false },
        { GGML_TYPE_Q8_0, 2560, 512, 8, 2, 8, 1, false },
        { GGML_TYPE_Q5_0, 320, 10240, 0, 1, 1, 1, false },
        { GGML_TYPE_Q5_0, 320, 10240, 0, 1, 8, 1, false },
    };
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;  // minutes there
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        for (const product_case & c : shapes) {
            const std::vector<int32_t> ids = draw_ids(c, rng);
            for (const product_way & w : ways(c)) {
                if (w.var) setenv(w.var, w.value, 1);
                // a backend a way: CUDA would replay the graph it captured the way before
                ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
                graph_run g;
                ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
                g.ctx                   = ggml_init(ip);
                const product_tensors t = make_product(g.ctx, c);
                if (graph_place(g, be, t.out)) {
                    ggml_backend_buffer_clear(g.buf, 0);
                    if (t.ids) ggml_backend_tensor_set(t.ids, ids.data(), 0, ggml_nbytes(t.ids));
                    const double us = time_graph(be, g.gf, 50);
                    const double tflops = 2.0 * c.n_in * c.n_out * c.n_used * c.n_tok / us / 1e6;
                    // decode steps: the weights' bytes a run must read (every expert a token uses, once)
                    const double gbs = c.n_tok <= 8 ? weight_bytes_read(c, ids) / us / 1e3 : 0.0;
                    std::printf("  %s%s %s: %.1f us/run, %.1f TFLOP/s", c.name().c_str(), way_name(w).c_str(),
                                ggml_backend_dev_name(dev), us, tflops);
                    std::printf(gbs > 0.0 ? ", %.0f GB/s of weights\n" : "\n", gbs);
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
