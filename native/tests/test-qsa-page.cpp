// Checks PYQSA_GGML_OP_QSA_PAGE_RESOLVE over multi-step scenarios: the CPU backend against a
// sequential LRU model written here (every output and all state after every step), every other
// backend against the CPU; and paged decode attention (page resolve -> paged cell lists ->
// qsa_attn over a hot cache and ring) against qsa_attn over the whole cache, bit for bit, on
// every backend; page staging and the prefill prefetch (fetch, wait, the chunk set over it)
// against the store on the CPU and the CPU on every backend. `trace` runs a scenario read from stdin on the CPU backend and prints
// each step, for the Python model of the policy (tests/unit/test_page_policy.py); `perf` times
// decode-shaped steps at 256K context, the prefill prefetch's bulk copy alone, beside a kernel,
// and the staged windows.
//
//   test-qsa-page [test|perf] [-b BACKEND]      exit code 0 when every case passed
//   test-qsa-page trace < scenario              see read_scenario() for the format
#include "op-check.h"
#include "pyqsa-ggml.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

struct page_shape {
    int64_t   ns, H, n_blocks, kb, n_q, E;
    ggml_type type;  // of the hot cache rows (E elements, B bytes)

    size_t B() const { return ggml_row_size(type, E); }

    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "QSA_PAGE_RESOLVE(ns=%lld,H=%lld,n_blocks=%lld,kb=%lld,n_q=%lld,B=%zu)",
                      (long long) ns, (long long) H, (long long) n_blocks, (long long) kb, (long long) n_q, B());
        return buf;
    }
};

struct page_step {
    std::vector<int32_t> blocks;  // [kb, n_q, ns]
    std::vector<int32_t> n_vis;   // [n_q * ns]
    int32_t              step;
};

struct page_state {
    std::vector<int32_t> table, owner, stamp, out;
    std::vector<int64_t> stats;
    std::vector<uint8_t> hot;

    bool operator==(const page_state & o) const {
        return table == o.table && owner == o.owner && stamp == o.stamp && out == o.out && stats == o.stats &&
               hot == o.hot;
    }
};

page_state empty_state(const page_shape & c) {
    page_state m;
    m.table.assign(c.n_blocks * c.ns, -1);
    m.owner.assign(c.H * c.ns, -1);
    m.stamp.assign(c.H * c.ns, -1);
    m.out.assign(c.kb * c.n_q * c.ns, -1);
    m.stats.assign(2 * c.ns, 0);
    m.hot.assign(c.B() * c.H * c.ns, 0);
    return m;
}

// The policy, one missed block at a time: each distinct missed block, in increasing order,
// evicts the unpinned slot used least recently (lowest slot on ties; never-used slots first).
void model_step(const page_shape & c, const page_step & st, const uint8_t * store, page_state & m) {
    const size_t B = c.B();
    for (int64_t s = 0; s < c.ns; ++s) {
        int32_t * table = m.table.data() + s * c.n_blocks;
        int32_t * owner = m.owner.data() + s * c.H;
        int32_t * stamp = m.stamp.data() + s * c.H;
        std::set<int32_t> missed;
        for (int64_t q = 0; q < c.n_q; ++q) {
            for (int64_t j = 0; j < c.kb; ++j) {
                const int32_t b = st.blocks[(s * c.n_q + q) * c.kb + j];
                if (b >= st.n_vis[s * c.n_q + q]) continue;
                if (table[b] >= 0) {
                    stamp[table[b]] = st.step;
                    ++m.stats[2 * s];
                } else {
                    missed.insert(b);
                }
            }
        }
        for (int32_t b : missed) {
            int32_t victim = -1;
            for (int32_t h = 0; h < c.H; ++h) {
                if (stamp[h] == st.step) continue;
                if (victim < 0 || stamp[h] < stamp[victim]) victim = h;
            }
            if (owner[victim] >= 0) table[owner[victim]] = -1;
            owner[victim] = b;
            stamp[victim] = st.step;
            table[b]      = victim;
            std::memcpy(m.hot.data() + (s * c.H + victim) * B, store + (s * c.n_blocks + b) * B, B);
            ++m.stats[2 * s + 1];
        }
        for (int64_t e = 0; e < c.kb * c.n_q; ++e) {
            const int32_t b = st.blocks[s * c.kb * c.n_q + e];
            m.out[s * c.kb * c.n_q + e] = b < st.n_vis[s * c.n_q + e / c.kb] ? table[b] : -1;
        }
    }
}

// One backend holding the paging state across steps; the graph is built once and rerun.
class page_runner {
public:
    page_runner(ggml_backend_t backend, const page_shape & c, const void * store) : backend(backend), c(c) {
        ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
        ctx    = ggml_init(ip);
        blocks = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, c.kb, c.n_q, c.ns);
        n_vis  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.n_q * c.ns);
        table  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.n_blocks, c.ns);
        owner  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.H, c.ns);
        stamp  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.H, c.ns);
        step   = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
        stats  = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 2, c.ns);
        hot    = ggml_new_tensor_3d(ctx, c.type, c.E, c.H, c.ns);
        out    = pyqsa_ggml_qsa_page_resolve(ctx, blocks, n_vis, table, owner, stamp, step, stats, hot, store, nullptr,
                                             nullptr, c.n_blocks);
        supported = ggml_backend_supports_op(backend, out);
        if (!supported) return;
        gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        const page_state m = empty_state(c);
        ggml_backend_tensor_set(table, m.table.data(), 0, ggml_nbytes(table));
        ggml_backend_tensor_set(owner, m.owner.data(), 0, ggml_nbytes(owner));
        ggml_backend_tensor_set(stamp, m.stamp.data(), 0, ggml_nbytes(stamp));
        ggml_backend_tensor_set(stats, m.stats.data(), 0, ggml_nbytes(stats));
        ggml_backend_tensor_set(hot, m.hot.data(), 0, ggml_nbytes(hot));
    }

    ~page_runner() {
        if (buf) ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }

    void run(const page_step & st) {
        ggml_backend_tensor_set(blocks, st.blocks.data(), 0, ggml_nbytes(blocks));
        ggml_backend_tensor_set(n_vis, st.n_vis.data(), 0, ggml_nbytes(n_vis));
        ggml_backend_tensor_set(step, &st.step, 0, sizeof(int32_t));
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            std::fprintf(stderr, "compute failed\n");
            std::exit(2);
        }
    }

    page_state read() const {
        page_state m = empty_state(c);
        ggml_backend_tensor_get(table, m.table.data(), 0, ggml_nbytes(table));
        ggml_backend_tensor_get(owner, m.owner.data(), 0, ggml_nbytes(owner));
        ggml_backend_tensor_get(stamp, m.stamp.data(), 0, ggml_nbytes(stamp));
        ggml_backend_tensor_get(out, m.out.data(), 0, ggml_nbytes(out));
        ggml_backend_tensor_get(stats, m.stats.data(), 0, ggml_nbytes(stats));
        ggml_backend_tensor_get(hot, m.hot.data(), 0, ggml_nbytes(hot));
        return m;
    }

    bool supported = false;

private:
    ggml_backend_t        backend;
    page_shape            c;
    ggml_context *        ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_cgraph *         gf  = nullptr;
    ggml_tensor *blocks, *n_vis, *table, *owner, *stamp, *step, *stats, *hot, *out;
};

// Host memory for the store: pinned through the first GPU's host buffer type when there is one
// (its kernels read the store in place), else plain memory.
class host_store {
public:
    explicit host_store(size_t bytes) {
        for (size_t i = 0; i < ggml_backend_dev_count() && !buf; ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;
            if (ggml_backend_buffer_type_t bt = ggml_backend_dev_host_buffer_type(dev)) {
                buf = ggml_backend_buft_alloc_buffer(bt, bytes);
            }
        }
        if (buf) {
            data = (uint8_t *) ggml_backend_buffer_get_base(buf);
        } else {
            plain.resize(bytes);
            data = plain.data();
        }
    }

    ~host_store() {
        if (buf) ggml_backend_buffer_free(buf);
    }

    uint8_t * data = nullptr;

private:
    ggml_backend_buffer_t buf = nullptr;
    std::vector<uint8_t>  plain;
};

// Decode-like selections: visibility grows, most picks come from a drifting working set.
std::vector<page_step> scenario(const page_shape & c, int n_steps, std::mt19937 & rng) {
    std::vector<page_step> steps;
    std::vector<int32_t>   pick;
    for (int t = 0; t < n_steps; ++t) {
        page_step st;
        st.step = 3 * t + 1;  // increasing, not consecutive
        for (int64_t s = 0; s < c.ns; ++s) {
            for (int64_t q = 0; q < c.n_q; ++q) {
                const int32_t vis = (int32_t) std::min<int64_t>(c.n_blocks, c.kb / 2 + (t + 1) * c.n_blocks / n_steps);
                const int32_t hot_lo = std::max<int32_t>(0, vis - (int32_t) (2 * c.kb) - t);
                std::set<int32_t> chosen;
                while ((int64_t) chosen.size() < std::min<int64_t>(c.kb, vis)) {
                    const bool from_hot = rng() % 10 < 7;
                    const int32_t lo = from_hot ? hot_lo : 0;
                    chosen.insert(lo + (int32_t) (rng() % (vis - lo)));
                }
                for (int32_t pad = vis; (int64_t) chosen.size() < c.kb; ++pad) {
                    chosen.insert(pad);  // top-k pads with blocks past n_vis
                }
                st.blocks.insert(st.blocks.end(), chosen.begin(), chosen.end());
                st.n_vis.push_back(vis);
            }
        }
        steps.push_back(std::move(st));
    }
    return steps;
}

// Paged decode attention against the unpaged op on one backend, over consecutive decode steps:
// the whole K/V cache is the host store (pinned); the device holds `hot` block slots and a ring
// of `ring` cells, to which each step writes the cells past the stored blocks. Two paged
// outputs: through the hot cache (resolve), and the prefill path (the store staged a window of
// `hot` blocks at a time into a second device cache, each window followed by a qsa_attn_part
// pass, then the ring's pass). Each step also
// writes its token's ring row back with qsa_page_write into a second host store, which must end
// up equal to the first at those rows; midway, stream 0 starts a new generation (a new
// sequence), after which all its visible selected blocks must miss once. Returns the first step whose output differs (or
// whose write-back or reset did not happen), -1 when none did.
struct paged_attn_case {
    int64_t D, Hq, Hkv, ns, n_kv, kb, hot, ring;
    int32_t r;

    std::string name() const {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "PAGED_ATTN(D=%lld,Hq=%lld,Hkv=%lld,ns=%lld,n_kv=%lld,kb=%lld,hot=%lld,ring=%lld,r=%d)",
                      (long long) D, (long long) Hq, (long long) Hkv, (long long) ns, (long long) n_kv, (long long) kb,
                      (long long) hot, (long long) ring, r);
        return buf;
    }
};

int paged_attention_diff(ggml_backend_t be, const paged_attn_case & c, const uint8_t * k_host, const uint8_t * v_host,
                         uint8_t * k_back, uint8_t * v_back, int n_steps, uint32_t seed, int64_t * misses,
                         bool * supported) {
    const int64_t n_blocks = c.n_kv / c.r, cells = c.hot * c.r + c.ring;
    const size_t  row = ggml_row_size(GGML_TYPE_F16, c.D) * c.Hkv;  // one cell's K (or V)
    const int64_t n_windows = (n_blocks + c.hot - 1) / c.hot;
    ggml_init_params ip = { ggml_tensor_overhead() * (48 + 6 * n_windows) + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * q      = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.D, c.Hq, 1, c.ns);
    ggml_tensor * blocks = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, c.kb, 1, c.ns);
    ggml_tensor * n_vis  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.ns);
    ggml_tensor * n_pgd  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.ns);
    ggml_tensor * pos    = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.ns);
    ggml_tensor * step   = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1 + c.ns);
    ggml_tensor * w_src  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, c.ns);
    ggml_tensor * w_dst  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, c.ns);
    ggml_tensor * table  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_blocks, c.ns);
    ggml_tensor * owner  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.hot, c.ns);
    ggml_tensor * stamp  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.hot, c.ns);
    ggml_tensor * stats  = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 2, c.ns);
    ggml_tensor * seen   = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.ns);
    ggml_tensor * k_all  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.D, c.Hkv, c.n_kv, c.ns);
    ggml_tensor * v_all  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.D, c.Hkv, c.n_kv, c.ns);
    ggml_tensor * k_dev  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.D, c.Hkv, cells, c.ns);
    ggml_tensor * v_dev  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.D, c.Hkv, cells, c.ns);
    ggml_tensor * k_pf   = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.D, c.Hkv, cells, c.ns);
    ggml_tensor * v_pf   = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.D, c.Hkv, cells, c.ns);
    // the hot slots as block rows: [r * Hkv * D, hot, ns], streams a whole device cache apart
    const auto slots_of = [&](ggml_tensor * t) {
        return ggml_view_3d(ctx, t, c.D * c.Hkv * c.r, c.hot, c.ns, row * c.r, t->nb[3], 0);
    };
    ggml_tensor * slots = pyqsa_ggml_qsa_page_resolve(ctx, blocks, n_pgd, table, owner, stamp, step, stats, slots_of(k_dev),
                                                      k_host, slots_of(v_dev), v_host, n_blocks);
    pyqsa_ggml_qsa_page_resolve_set_generations(slots, seen);
    ggml_tensor * cells_p = pyqsa_ggml_qsa_block_cells_paged(ctx, blocks, slots, n_vis, n_pgd, pos, c.r,
                                                             (int32_t) (c.hot * c.r), (int32_t) c.ring);
    ggml_tensor * cells_u = pyqsa_ggml_qsa_block_cells(ctx, blocks, n_vis, pos, c.r);
    const float   scale   = 1.0f / std::sqrt((float) c.D);
    ggml_tensor * paged   = pyqsa_ggml_qsa_attn(ctx, q, k_dev, v_dev, cells_p, scale);
    ggml_tensor * whole   = pyqsa_ggml_qsa_attn(ctx, q, k_all, v_all, cells_u, scale);
    ggml_tensor * state   = nullptr;
    std::vector<ggml_tensor *> ops;
    for (int64_t w = 0; w < n_windows; ++w) {
        ggml_tensor * staged = pyqsa_ggml_qsa_page_stage(ctx, blocks, n_pgd, slots_of(k_pf), k_host, slots_of(v_pf),
                                                         v_host, n_blocks, w * c.hot, state, nullptr);
        state = pyqsa_ggml_qsa_attn_part(ctx, q, k_pf, v_pf, cells_u, n_pgd, state, staged, scale, c.r,
                                         (int32_t) (w * c.hot * c.r), (int32_t) ((w + 1) * c.hot * c.r), 0, 0, false);
        ops.insert(ops.end(), { staged, state });
    }
    ggml_tensor * in_host = pyqsa_ggml_qsa_attn_part(ctx, q, k_pf, v_pf, cells_u, n_pgd, state, nullptr, scale, c.r, 0,
                                                     0, (int32_t) (c.hot * c.r), (int32_t) c.ring, true);
    ops.push_back(in_host);
    const auto    rows_of = [&](ggml_tensor * t) { return ggml_view_2d(ctx, t, c.D * c.Hkv, cells * c.ns, row, 0); };
    ggml_tensor * write   = pyqsa_ggml_qsa_page_write(ctx, rows_of(k_dev), rows_of(v_dev), w_src, w_dst, w_dst, k_back, v_back);
    *supported = true;
    for (ggml_tensor * t : { slots, paged, whole, cells_p, write }) {
        ops.push_back(t);
    }
    for (ggml_tensor * t : ops) {
        *supported = *supported && ggml_backend_supports_op(be, t);
    }
    int diff = -1;
    if (*supported) {
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, paged);
        ggml_build_forward_expand(gf, in_host);
        ggml_build_forward_expand(gf, whole);
        ggml_build_forward_expand(gf, write);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        const std::vector<int32_t> none_b(n_blocks * c.ns, -1), none_h(c.hot * c.ns, -1);
        const std::vector<int64_t> zero(2 * c.ns, 0);
        ggml_backend_tensor_set(table, none_b.data(), 0, ggml_nbytes(table));
        ggml_backend_tensor_set(owner, none_h.data(), 0, ggml_nbytes(owner));
        ggml_backend_tensor_set(stamp, none_h.data(), 0, ggml_nbytes(stamp));
        ggml_backend_tensor_set(stats, zero.data(), 0, ggml_nbytes(stats));
        ggml_backend_tensor_set(seen, zero.data(), 0, ggml_nbytes(seen));
        ggml_backend_tensor_set(k_all, k_host, 0, ggml_nbytes(k_all));
        ggml_backend_tensor_set(v_all, v_host, 0, ggml_nbytes(v_all));
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float>   qv(ggml_nelements(q));
        std::vector<int32_t> bl, vis(c.ns), pgd(c.ns), ps(c.ns);
        std::vector<int64_t> src_rows(c.ns), dst_rows(c.ns), st_prev(2 * c.ns, 0), st_now(2 * c.ns);
        const int reset_at = n_steps / 2;
        for (int t = 0; t < n_steps && diff < 0; ++t) {
            bl.clear();
            for (int64_t s = 0; s < c.ns; ++s) {
                ps[s]  = (int32_t) (c.n_kv - n_steps + t - 7 * s);  // each stream one token further per step
                vis[s] = (ps[s] + 1) / c.r;
                pgd[s] = ps[s] / c.r;  // blocks completed before this step's token
                // the ring gets the cells past the stored blocks, this step's token included
                for (int32_t p = pgd[s] * c.r; p <= ps[s]; ++p) {
                    const size_t dst = ((size_t) s * cells + c.hot * c.r + p % c.ring) * row;
                    const size_t src = ((size_t) s * c.n_kv + p) * row;
                    ggml_backend_tensor_set(k_dev, k_host + src, dst, row);
                    ggml_backend_tensor_set(v_dev, v_host + src, dst, row);
                    ggml_backend_tensor_set(k_pf, k_host + src, dst, row);
                    ggml_backend_tensor_set(v_pf, v_host + src, dst, row);
                }
                std::set<int32_t> pick;
                while ((int64_t) pick.size() < c.kb) {  // most picks near the end: hits and misses
                    const int32_t lo = rng() % 4 ? std::max<int32_t>(0, vis[s] - (int32_t) (3 * c.kb)) : 0;
                    pick.insert(lo + (int32_t) (rng() % (vis[s] - lo)));
                }
                bl.insert(bl.end(), pick.begin(), pick.end());
                src_rows[s] = s * cells + c.hot * c.r + ps[s] % c.ring;
                dst_rows[s] = s * c.n_kv + ps[s];
            }
            for (float & x : qv) x = nd(rng);
            std::vector<int32_t> st(1 + c.ns, 0);
            st[0] = t + 1;
            st[1] = t >= reset_at;  // stream 0's second generation: one reset, at reset_at
            ggml_backend_tensor_set(q, qv.data(), 0, ggml_nbytes(q));
            ggml_backend_tensor_set(blocks, bl.data(), 0, ggml_nbytes(blocks));
            ggml_backend_tensor_set(n_vis, vis.data(), 0, ggml_nbytes(n_vis));
            ggml_backend_tensor_set(n_pgd, pgd.data(), 0, ggml_nbytes(n_pgd));
            ggml_backend_tensor_set(pos, ps.data(), 0, ggml_nbytes(pos));
            ggml_backend_tensor_set(step, st.data(), 0, ggml_nbytes(step));
            ggml_backend_tensor_set(w_src, src_rows.data(), 0, ggml_nbytes(w_src));
            ggml_backend_tensor_set(w_dst, dst_rows.data(), 0, ggml_nbytes(w_dst));
            if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
                std::fprintf(stderr, "compute failed\n");
                std::exit(2);
            }
            std::vector<float> a(ggml_nelements(paged)), h(a.size()), b(a.size());
            ggml_backend_tensor_get(paged, a.data(), 0, ggml_nbytes(paged));
            ggml_backend_tensor_get(in_host, h.data(), 0, ggml_nbytes(in_host));
            ggml_backend_tensor_get(whole, b.data(), 0, ggml_nbytes(whole));
            if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0 ||
                std::memcmp(h.data(), b.data(), h.size() * sizeof(float)) != 0) {
                diff = t;
            }
            for (int64_t s = 0; s < c.ns; ++s) {  // the write-back landed
                const size_t at = dst_rows[s] * row;
                if (std::memcmp(k_back + at, k_host + at, row) != 0 || std::memcmp(v_back + at, v_host + at, row) != 0) {
                    diff = t;
                }
            }
            ggml_backend_tensor_get(stats, st_now.data(), 0, ggml_nbytes(stats));
            if (t == reset_at) {  // stream 0 forgot its hot cache: every visible selected block missed
                std::set<int32_t> visible;
                for (int64_t j = 0; j < c.kb; ++j) {
                    if (bl[j] < pgd[0]) visible.insert(bl[j]);
                }
                if (st_now[0] != st_prev[0] || st_now[1] - st_prev[1] != (int64_t) visible.size()) diff = t;
            }
            st_prev = st_now;
        }
        *misses = 0;
        for (int64_t s = 0; s < c.ns; ++s) *misses += st_prev[2 * s + 1];
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return diff;
}

// The staged windows' qsa_attn_part passes reproduce qsa_attn's CUDA-core kernel, so on CUDA the
// unpaged reference is that kernel (PYQSA_QSA_ATTN_MMA=0), not the tensor-core one f16 calls take
void test_paged_attention(ggml_backend_t cpu, const char * only_backend, int & n_ok, int & n_fail) {
    setenv("PYQSA_QSA_ATTN_MMA", "0", 1);
    const paged_attn_case cases[] = {
        { 64, 4, 2, 2, 2048, 16, 32, 7, 4 },     // ring not a multiple of r
        { 256, 24, 2, 3, 8192, 64, 128, 4, 4 },  // Flash-Next heads; ring == r
        { 128, 4, 1, 1, 512, 8, 8, 3, 1 },       // r = 1, hot == kb: every unselected slot evicted
    };
    for (const paged_attn_case & c : cases) {
        const size_t bytes = ggml_row_size(GGML_TYPE_F16, c.D) * c.Hkv * c.n_kv * c.ns;
        host_store   k_host(bytes), v_host(bytes), k_back(bytes), v_back(bytes);
        std::mt19937 rng(99);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(bytes / 2);
        for (host_store * h : { &k_host, &v_host }) {
            for (float & e : x) e = nd(rng);
            ggml_fp32_to_fp16_row(x.data(), (ggml_fp16_t *) h->data, (int64_t) x.size());
        }
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            const bool is_cpu = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
            if (!is_cpu && only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
            ggml_backend_t be = is_cpu ? cpu : ggml_backend_dev_init(dev, nullptr);
            bool    supported = false;
            int64_t misses    = 0;
            std::memset(k_back.data, 0, bytes);  // each backend's write-back checked on its own
            std::memset(v_back.data, 0, bytes);
            const int diff = paged_attention_diff(be, c, k_host.data, v_host.data, k_back.data, v_back.data, 40, 7,
                                                  &misses, &supported);
            const std::string d = !supported ? "not supported "
                                  : diff < 0 ? "hot-cache and staged-window attention equal to unpaged over 40 steps, "
                                               "write-back and reset checked (" + std::to_string(misses) + " misses) "
                                             : "differs from unpaged at step " + std::to_string(diff) + " ";
            report(c.name(), ggml_backend_dev_name(dev), d, supported && diff < 0 && misses > c.kb, n_ok, n_fail);
            if (!is_cpu) ggml_backend_free(be);
        }
    }
    unsetenv("PYQSA_QSA_ATTN_MMA");
}

// qsa_page_stage on one backend: per stream, the blocks of the window [b0, b0 + S) below n_paged
// that some query selects, copied to slot b - b0; the other slots keep their (zeroed) bytes; the
// copied blocks are added to a tally.
// Returns false when not supported.
struct stage_case {
    int64_t ns, n_q, kb, n_blocks, S, b0;
    int32_t B;  // bytes per block

    std::string name() const {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "QSA_PAGE_STAGE(ns=%lld,n_q=%lld,kb=%lld,n_blocks=%lld,S=%lld,b0=%lld,B=%d)",
                      (long long) ns, (long long) n_q, (long long) kb, (long long) n_blocks, (long long) S,
                      (long long) b0, B);
        return buf;
    }
};

bool run_stage(ggml_backend_t be, const stage_case & c, const uint8_t * store, const std::vector<int32_t> & bl,
               const std::vector<int32_t> & pgd, std::vector<int32_t> & out, std::vector<uint8_t> & staged) {
    ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * blocks = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, c.kb, c.n_q, c.ns);
    ggml_tensor * n_pgd  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.n_q * c.ns);
    ggml_tensor * stage  = ggml_new_tensor_3d(ctx, GGML_TYPE_I8, c.B, c.S, c.ns);
    ggml_tensor * tally  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, c.ns);
    ggml_tensor * counts = pyqsa_ggml_qsa_page_stage(ctx, blocks, n_pgd, stage, store, nullptr, nullptr, c.n_blocks,
                                                     c.b0, nullptr, tally);
    const bool ok = ggml_backend_supports_op(be, counts);
    if (ok) {
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, counts);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        ggml_backend_buffer_clear(buf, 0);
        ggml_backend_tensor_set(blocks, bl.data(), 0, ggml_nbytes(blocks));
        ggml_backend_tensor_set(n_pgd, pgd.data(), 0, ggml_nbytes(n_pgd));
        const std::vector<int64_t> start(c.ns, 5);  // the tally adds to what it held
        ggml_backend_tensor_set(tally, start.data(), 0, ggml_nbytes(tally));
        if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
            std::fprintf(stderr, "compute failed\n");
            std::exit(2);
        }
        std::vector<int64_t> tallied(c.ns);
        ggml_backend_tensor_get(tally, tallied.data(), 0, ggml_nbytes(tally));
        out.resize(ggml_nelements(counts));
        staged.resize(ggml_nbytes(stage));
        ggml_backend_tensor_get(counts, out.data(), 0, ggml_nbytes(counts));
        for (int64_t s = 0; s < c.ns; ++s) {
            if (tallied[s] != 5 + out[s]) out[s] = -1;  // a wrong tally fails the comparison below
        }
        ggml_backend_tensor_get(stage, staged.data(), 0, ggml_nbytes(stage));
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return ok;
}

void test_page_stage(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail) {
    const stage_case cases[] = {
        { 2, 16, 8, 300, 40, 120, 20 },          // a window in the middle, some slots left alone
        { 3, 4, 16, 5000, 4096, 0, 64 },         // the first window
        { 1, 512, 32, 65536, 1024, 32768, 16 },  // a window of a prefill chunk at 256K
    };
    for (const stage_case & c : cases) {
        host_store store(c.B * c.n_blocks * c.ns);
        for (size_t i = 0; i < (size_t) c.B * c.n_blocks * c.ns; ++i) store.data[i] = (uint8_t) rng();
        std::vector<int32_t> bl, pgd(c.n_q * c.ns);
        for (int64_t s = 0; s < c.ns; ++s) {
            const int32_t paged = (int32_t) (c.n_blocks / 2 + rng() % (c.n_blocks / 2));
            for (int64_t q = 0; q < c.n_q; ++q) {
                pgd[s * c.n_q + q] = paged;
                std::set<int32_t> pick;  // blocks at and past n_paged too: not stored, not staged
                while ((int64_t) pick.size() < c.kb) pick.insert((int32_t) (rng() % c.n_blocks));
                bl.insert(bl.end(), pick.begin(), pick.end());
            }
        }
        bool good = true;
        std::vector<int32_t> out, out_other;
        std::vector<uint8_t> staged, staged_other;
        const bool supported = run_stage(cpu, c, store.data, bl, pgd, out, staged);
        int64_t n_staged = 0;
        const std::vector<uint8_t> zero(c.B, 0);
        for (int64_t s = 0; supported && s < c.ns; ++s) {
            std::set<int32_t> wanted;
            for (int64_t e = 0; e < c.kb * c.n_q; ++e) {
                const int32_t b = bl[s * c.kb * c.n_q + e];
                if (b >= c.b0 && b < c.b0 + c.S && b < pgd[s * c.n_q + e / c.kb]) wanted.insert(b);
            }
            good = good && out[s] == (int32_t) wanted.size();
            for (int64_t i = 0; i < c.S; ++i) {
                const uint8_t * want = wanted.count((int32_t) (c.b0 + i)) ? store.data + (s * c.n_blocks + c.b0 + i) * c.B
                                                                          : zero.data();
                good = good && std::memcmp(staged.data() + (s * c.S + i) * c.B, want, c.B) == 0;
            }
            n_staged += (int64_t) wanted.size();
        }
        const std::string d = "vs reference (" + std::to_string(n_staged) + " blocks staged) ";
        report(c.name(), "CPU", d, supported && good && n_staged > 0, n_ok, n_fail);
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            const bool ok = run_stage(be, c, store.data, bl, pgd, out_other, staged_other);
            const bool eq = ok && out_other == out && staged_other == staged;
            return std::make_pair(eq, std::string(!ok ? "not supported " : eq ? "vs CPU: counts and staged rows " : "vs CPU: differs "));
        });
    }
}

// qsa_page_fetch, then its wait, then a chunk's rows set over the fetched area (the order a
// prefetching layer runs them in): per stream, the area holds store rows [0, n_rows) but the set
// rows, which hold the chunk's values in f16. Returns false when not supported.
struct fetch_case {
    int64_t ns, n_rows, store_rows, E, n_set;

    std::string name() const {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "QSA_PAGE_FETCH(ns=%lld,n_rows=%lld,store_rows=%lld,E=%lld,n_set=%lld)",
                      (long long) ns, (long long) n_rows, (long long) store_rows, (long long) E, (long long) n_set);
        return buf;
    }
};

// the graph's area tensors (K, V) after the run, bytes
bool run_fetch(ggml_backend_t be, const fetch_case & c, const uint8_t * store_k, const uint8_t * store_v,
               const std::vector<float> & chunk, const std::vector<int64_t> & rows, std::vector<uint8_t> & out) {
    graph_run g;
    ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
    g.ctx = ggml_init(ip);
    ggml_tensor * area[2], * src = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, c.E, c.n_set);
    ggml_tensor * idx = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I64, c.n_set);
    for (ggml_tensor *& a : area) a = ggml_new_tensor_3d(g.ctx, GGML_TYPE_F16, c.E, c.n_rows, c.ns);
    ggml_tensor * f = pyqsa_ggml_qsa_page_fetch(g.ctx, area[0], store_k, area[1], store_v, c.store_rows, nullptr);
    ggml_tensor * set[2];
    for (int j = 0; j < 2; ++j) {
        ggml_tensor * w = pyqsa_ggml_qsa_page_fetch_wait(g.ctx, f, area[j]);
        set[j] = ggml_set_rows(g.ctx, ggml_reshape_2d(g.ctx, w, c.E, c.n_rows * c.ns), src, idx);
    }
    if (!ggml_backend_supports_op(be, f) || !graph_place(g, be, set[0])) return false;
    ggml_build_forward_expand(g.gf, set[1]);
    ggml_backend_buffer_clear(g.buf, 0x5a);  // what a fetch leaves alone would show
    ggml_backend_tensor_set(src, chunk.data(), 0, ggml_nbytes(src));
    ggml_backend_tensor_set(idx, rows.data(), 0, ggml_nbytes(idx));
    if (ggml_backend_graph_compute(be, g.gf) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "compute failed\n");
        std::exit(2);
    }
    out.resize(2 * ggml_nbytes(area[0]));
    for (int j = 0; j < 2; ++j) ggml_backend_tensor_get(area[j], out.data() + j * ggml_nbytes(area[0]), 0, ggml_nbytes(area[0]));
    return true;
}

void test_page_fetch(ggml_backend_t cpu, const char * only_backend, std::mt19937 & rng, int & n_ok, int & n_fail) {
    const fetch_case cases[] = {
        { 1, 1000, 4096, 512, 24 },  // one stream's history and a chunk at its end
        { 3, 300, 512, 64, 9 },      // streams side by side, the area shorter than the store
    };
    for (const fetch_case & c : cases) {
        const size_t B = c.E * sizeof(ggml_fp16_t), bytes = B * c.store_rows * c.ns;
        host_store k(bytes), v(bytes);
        for (size_t i = 0; i < bytes; ++i) {
            k.data[i] = (uint8_t) rng();
            v.data[i] = (uint8_t) rng();
        }
        std::vector<float> chunk(c.E * c.n_set);
        for (float & x : chunk) x = (float) (rng() % 2001) / 1000.0f - 1.0f;
        std::vector<int64_t> rows;  // the last n_set / ns rows of each stream's area
        for (int64_t s = 0; s < c.ns; ++s)
            for (int64_t i = 0; i < c.n_set / c.ns; ++i) rows.push_back(s * c.n_rows + c.n_rows - c.n_set / c.ns + i);
        std::vector<uint8_t> want(2 * B * c.n_rows * c.ns);
        for (int j = 0; j < 2; ++j) {
            uint8_t * a = want.data() + j * B * c.n_rows * c.ns;
            for (int64_t s = 0; s < c.ns; ++s) std::memcpy(a + s * c.n_rows * B, (j ? v : k).data + s * c.store_rows * B, c.n_rows * B);
            for (size_t i = 0; i < rows.size(); ++i) ggml_fp32_to_fp16_row(chunk.data() + i * c.E, (ggml_fp16_t *) (a + rows[i] * B), c.E);
        }
        std::vector<uint8_t> out, out_other;
        const bool supported = run_fetch(cpu, c, k.data, v.data, chunk, rows, out);
        report(c.name(), "CPU", "vs the store and the chunk's rows ", supported && out == want, n_ok, n_fail);
        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            const bool ok = run_fetch(be, c, k.data, v.data, chunk, rows, out_other);
            const bool eq = ok && out_other == out;
            return std::make_pair(eq, std::string(!ok ? "not supported " : eq ? "vs CPU: area bytes " : "vs CPU: differs "));
        });
    }
}

int cmd_test(const char * only_backend) {
    std::mt19937 rng(4321);
    int n_ok = 0, n_fail = 0;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, 4);
    const page_shape cases[] = {
        { 2, 12, 40, 4, 2, 5, GGML_TYPE_I32 },          // odd rows (20 bytes), two queries per stream
        { 3, 1024, 4096, 512, 1, 1024, GGML_TYPE_F16 },  // decode: 2 KiB blocks, H = 2 kb
        { 1, 8, 8, 8, 1, 16, GGML_TYPE_F32 },           // everything resident: H == n_blocks == kb
        { 2, 40, 300, 16, 2, 64, GGML_TYPE_Q8_0 },      // quantized rows
        { 2, 8192, 20000, 2048, 2, 16, GGML_TYPE_F16 },  // the largest hot cache CUDA takes (96 KiB of sort keys)
    };
    for (const page_shape & c : cases) {
        const size_t B = c.B();
        host_store   store(B * c.n_blocks * c.ns);
        for (size_t i = 0; i < B * c.n_blocks * c.ns; ++i) store.data[i] = (uint8_t) rng();
        const std::vector<page_step> steps = scenario(c, 24, rng);

        page_state model = empty_state(c);
        page_runner on_cpu(cpu, c, store.data);
        std::vector<page_state> cpu_states;
        int bad_step = -1;
        for (size_t t = 0; t < steps.size(); ++t) {
            model_step(c, steps[t], store.data, model);
            on_cpu.run(steps[t]);
            cpu_states.push_back(on_cpu.read());
            if (bad_step < 0 && !(cpu_states.back() == model)) bad_step = (int) t;
        }
        int64_t hits = 0, misses = 0;
        for (int64_t s = 0; s < c.ns; ++s) {
            hits += model.stats[2 * s];
            misses += model.stats[2 * s + 1];
        }
        char detail[128];
        std::snprintf(detail, sizeof(detail), "vs model over %zu steps (%lld hits, %lld misses%s) ", steps.size(),
                      (long long) hits, (long long) misses,
                      bad_step < 0 ? "" : (", first difference at step " + std::to_string(bad_step)).c_str());
        report(c.name(), "CPU", detail, on_cpu.supported && bad_step < 0 && misses > 0, n_ok, n_fail);

        on_other_backends(only_backend, c.name(), n_ok, n_fail, [&](ggml_backend_t be) {
            page_runner other(be, c, store.data);
            int diff = -1;
            for (size_t t = 0; other.supported && t < steps.size() && diff < 0; ++t) {
                other.run(steps[t]);
                if (!(other.read() == cpu_states[t])) diff = (int) t;
            }
            const std::string d = !other.supported ? "not supported "
                                  : diff < 0      ? "vs CPU, every step: "
                                                  : "vs CPU: first difference at step " + std::to_string(diff) + " ";
            return std::make_pair(other.supported && diff < 0, d);
        });
    }
    test_paged_attention(cpu, only_backend, n_ok, n_fail);
    test_page_stage(cpu, only_backend, rng, n_ok, n_fail);
    test_page_fetch(cpu, only_backend, rng, n_ok, n_fail);
    ggml_backend_free(cpu);
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

// stdin: "ns H n_blocks kb n_q n_steps", then per step its number and, per stream and query,
// n_vis and kb block ids. stdout, per step and stream: "out" kb*n_q slots, "owner" H blocks,
// "stats" hits misses. Blocks hold 4 bytes: the store row of block b of stream s is s*n_blocks + b.
int cmd_trace() {
    page_shape c{};
    int n_steps = 0;
    std::cin >> c.ns >> c.H >> c.n_blocks >> c.kb >> c.n_q >> n_steps;
    if (!std::cin || c.ns < 1 || c.H < c.kb * c.n_q || c.n_blocks < 1 || n_steps < 0) {
        std::fprintf(stderr, "trace: bad header\n");
        return 2;
    }
    c.E = 1;
    c.type = GGML_TYPE_I32;
    std::vector<int32_t> store(c.n_blocks * c.ns);
    for (size_t i = 0; i < store.size(); ++i) store[i] = (int32_t) i;
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    int rc = 0;
    {
        page_runner r(cpu, c, store.data());
        for (int t = 0; t < n_steps && rc == 0; ++t) {
            page_step st;
            st.blocks.resize(c.kb * c.n_q * c.ns);
            st.n_vis.resize(c.n_q * c.ns);
            std::cin >> st.step;
            for (int64_t sq = 0; sq < c.n_q * c.ns; ++sq) {
                std::cin >> st.n_vis[sq];
                for (int64_t j = 0; j < c.kb; ++j) std::cin >> st.blocks[sq * c.kb + j];
            }
            if (!std::cin) {
                std::fprintf(stderr, "trace: short input at step %d\n", t);
                rc = 2;
                break;
            }
            r.run(st);
            const page_state m = r.read();
            for (int64_t s = 0; s < c.ns; ++s) {
                // the hot rows must hold the store rows of their owners
                for (int64_t h = 0; h < c.H; ++h) {
                    const int32_t b = m.owner[s * c.H + h];
                    int32_t row;
                    std::memcpy(&row, m.hot.data() + (s * c.H + h) * 4, 4);
                    if (b >= 0 && row != store[s * c.n_blocks + b]) {
                        std::fprintf(stderr, "trace: step %d stream %lld slot %lld holds the wrong row\n", t, (long long) s, (long long) h);
                        rc = 1;
                    }
                }
                std::printf("out");
                for (int64_t e = 0; e < c.kb * c.n_q; ++e) std::printf(" %d", m.out[s * c.kb * c.n_q + e]);
                std::printf("\nowner");
                for (int64_t h = 0; h < c.H; ++h) std::printf(" %d", m.owner[s * c.H + h]);
                std::printf("\nstats %lld %lld\n", (long long) m.stats[2 * s], (long long) m.stats[2 * s + 1]);
            }
        }
    }
    ggml_backend_free(cpu);
    return rc;
}

// a paged prefill chunk's attention at 256K: n_q queries of one stream selecting 512 random blocks
// of 4 cells each (plus the tail) from 65536 stored blocks, Flash-Next heads, a hot area of `hot`
// blocks: 65536 / hot staged windows and passes, then the ring's pass; against qsa_attn over the
// whole cache on the device. The window (the hot cache, --hot-blocks) sets how many passes and
// stagings a chunk costs, the chunk (--prefill-batch-tokens) how often the history is staged.
void perf_prefill_attention(ggml_backend_t be, const char * dev_name, int64_t hot, int64_t n_q) {
    const int64_t D = 256, Hq = 24, Hkv = 2, kb = 512, n_blocks = 65536, ring = n_q + 3;
    const int32_t r = 4;
    const int64_t n_kv = n_blocks * r + n_q, rows = hot * r + ring, n_windows = n_blocks / hot;
    const size_t  row  = ggml_row_size(GGML_TYPE_F16, D) * Hkv;
    host_store    k_host(row * n_kv), v_host(row * n_kv);
    std::memset(k_host.data, 0, row * n_kv);
    std::memset(v_host.data, 0, row * n_kv);
    ggml_init_params ip = { ggml_tensor_overhead() * (16 + 6 * n_windows) + 2 * ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * q      = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, Hq, n_q, 1);
    ggml_tensor * blocks = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, kb, n_q, 1);
    ggml_tensor * n_vis  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    ggml_tensor * n_pgd  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    ggml_tensor * pos    = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    ggml_tensor * k_dev  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, rows, 1);
    ggml_tensor * v_dev  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, rows, 1);
    ggml_tensor * k_all  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, n_kv, 1);
    ggml_tensor * v_all  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, n_kv, 1);
    ggml_tensor * cells  = pyqsa_ggml_qsa_block_cells(ctx, blocks, n_vis, pos, r);
    const auto slots_of  = [&](ggml_tensor * t) { return ggml_view_3d(ctx, t, D * Hkv * r, hot, 1, row * r, t->nb[3], 0); };
    ggml_tensor * state   = nullptr;
    for (int64_t w = 0; w < n_windows; ++w) {
        ggml_tensor * staged = pyqsa_ggml_qsa_page_stage(ctx, blocks, n_pgd, slots_of(k_dev), k_host.data,
                                                         slots_of(v_dev), v_host.data, n_kv / r, w * hot, state, nullptr);
        state = pyqsa_ggml_qsa_attn_part(ctx, q, k_dev, v_dev, cells, n_pgd, state, staged, 0.0625f, r,
                                         (int32_t) (w * hot * r), (int32_t) ((w + 1) * hot * r), 0, 0, false);
    }
    ggml_tensor * paged = pyqsa_ggml_qsa_attn_part(ctx, q, k_dev, v_dev, cells, n_pgd, state, nullptr, 0.0625f, r, 0, 0,
                                                   (int32_t) (hot * r), (int32_t) ring, true);
    ggml_tensor * whole = pyqsa_ggml_qsa_attn(ctx, q, k_all, v_all, cells, 0.0625f);
    if (ggml_backend_supports_op(be, paged) && ggml_backend_supports_op(be, state)) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        ggml_backend_buffer_clear(buf, 0);
        std::mt19937 rng(5);
        std::vector<int32_t> bl, vis(n_q), pgd(n_q, (int32_t) n_blocks), ps(n_q);
        for (int64_t i = 0; i < n_q; ++i) {
            ps[i]  = (int32_t) (n_blocks * r + i);
            vis[i] = (ps[i] + 1) / r;
            std::set<int32_t> pick;
            while ((int64_t) pick.size() < kb) pick.insert((int32_t) (rng() % n_blocks));
            bl.insert(bl.end(), pick.begin(), pick.end());
        }
        ggml_backend_tensor_set(blocks, bl.data(), 0, ggml_nbytes(blocks));
        ggml_backend_tensor_set(n_vis, vis.data(), 0, ggml_nbytes(n_vis));
        ggml_backend_tensor_set(n_pgd, pgd.data(), 0, ggml_nbytes(n_pgd));
        ggml_backend_tensor_set(pos, ps.data(), 0, ggml_nbytes(pos));
        for (ggml_tensor * out : { paged, whole }) {
            ggml_cgraph * gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, out);
            const std::vector<double> us = sorted_runs_us(be, gf);
            const double bytes = out == paged ? (double) n_blocks * r * 2 * row : 0.0;  // every block is selected
            const std::string what = out == paged ? "paged: " + std::to_string(n_windows) + " staged windows of " +
                                                        std::to_string(hot) + " blocks + ring"
                                                  : std::string("unpaged qsa_attn");
            std::printf("  QSA prefill attention (n_q=%lld, kb=%lld, 256K, %s) %s: %.0f us/run (median of 5, %.0f-%.0f)%s\n",
                        (long long) n_q, (long long) kb, what.c_str(), dev_name, us[2], us[0], us[4],
                        out == paged ? (", " + std::to_string((int) (bytes / us[2] / 1e3)) + " GB/s of host K/V staged").c_str() : "");
        }
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
}

// One QSA layer's prefetch at 256K (f16 K and V of 2 heads x 256: 1 KiB a row each, 512 MiB in
// all) alone, a 2048-query prefill attention alone (the work a copy overlaps: in the model, the
// layers between two QSA layers), and both in one graph, the copy forked before the attention
// and joined after it: with the copy engine in parallel the last is near the larger of the two.
void perf_prefetch(ggml_backend_t be, const char * dev_name) {
    const int64_t D = 256, Hq = 24, Hkv = 2, kb = 512, n_blocks = 65536, n_q = 2048;
    const int32_t r = 4;
    const int64_t n_kv = n_blocks * r;
    const size_t  row  = ggml_row_size(GGML_TYPE_F16, D) * Hkv;
    host_store    k_host(row * n_kv), v_host(row * n_kv);
    std::memset(k_host.data, 0, row * n_kv);
    std::memset(v_host.data, 0, row * n_kv);
    ggml_init_params ip = { ggml_tensor_overhead() * 32 + 4 * ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * q      = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, Hq, n_q, 1);
    ggml_tensor * blocks = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, kb, n_q, 1);
    ggml_tensor * n_vis  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    ggml_tensor * pos    = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    ggml_tensor * k_all  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, n_kv, 1);
    ggml_tensor * v_all  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, n_kv, 1);
    ggml_tensor * area_k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D * Hkv, n_kv, 1);
    ggml_tensor * area_v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D * Hkv, n_kv, 1);
    ggml_tensor * cells  = pyqsa_ggml_qsa_block_cells(ctx, blocks, n_vis, pos, r);
    ggml_tensor * attn   = pyqsa_ggml_qsa_attn(ctx, q, k_all, v_all, cells, 0.0625f);
    ggml_tensor * fetch  = pyqsa_ggml_qsa_page_fetch(ctx, area_k, k_host.data, area_v, v_host.data, n_kv, nullptr);
    ggml_tensor * joined = pyqsa_ggml_qsa_page_fetch_wait(ctx, fetch, area_k);
    if (!ggml_backend_supports_op(be, fetch) || !ggml_backend_supports_op(be, attn)) {
        std::printf("  QSA prefetch (256K) %s: not supported\n", dev_name);
        ggml_free(ctx);
        return;
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_buffer_clear(buf, 0);
    std::mt19937 rng(5);
    std::vector<int32_t> bl, vis(n_q), ps(n_q);
    for (int64_t i = 0; i < n_q; ++i) {
        ps[i]  = (int32_t) (n_kv - n_q + i);
        vis[i] = (ps[i] + 1) / r;
        std::set<int32_t> pick;
        while ((int64_t) pick.size() < kb) pick.insert((int32_t) (rng() % (vis[i])));
        bl.insert(bl.end(), pick.begin(), pick.end());
    }
    ggml_backend_tensor_set(blocks, bl.data(), 0, ggml_nbytes(blocks));
    ggml_backend_tensor_set(n_vis, vis.data(), 0, ggml_nbytes(n_vis));
    ggml_backend_tensor_set(pos, ps.data(), 0, ggml_nbytes(pos));
    const auto time_of = [&](std::initializer_list<ggml_tensor *> outs) {
        ggml_cgraph * gf = ggml_new_graph(ctx);
        for (ggml_tensor * t : outs) ggml_build_forward_expand(gf, t);
        return sorted_runs_us(be, gf);
    };
    const std::vector<double> copy = time_of({ joined }), work = time_of({ attn }), both = time_of({ fetch, attn, joined });
    const double bytes = 2.0 * row * n_kv;
    std::printf("  QSA prefetch (one layer at 256K, %.0f MiB) %s: copy alone %.0f us/run (%.1f GB/s), 2048-query "
                "attention alone %.0f us/run, both in one graph %.0f us/run (medians of 5; sum %.0f, larger %.0f)\n",
                bytes / 1048576.0, dev_name, copy[2], bytes / copy[2] / 1e3, work[2], both[2], copy[2] + work[2],
                std::max(copy[2], work[2]));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

// decode steps at 256K context: 8 streams, 512 selected blocks each, 8 KiB blocks (4 cells of
// f16 K and V, 2 heads x 256), a hot cache of 1024 slots (the default) and of 8192 (the most a
// GPU's resolve takes, what a device budget can grow it to); steps that miss 0%, ~6% and 100%
int cmd_perf(const char * only_backend) {
    host_store store(ggml_row_size(GGML_TYPE_F16, 4096) * 65536 * 8);
    std::memset(store.data, 1, ggml_row_size(GGML_TYPE_F16, 4096) * 65536 * 8);
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
        for (int64_t hot : { 1024, 8192 }) {
            const page_shape c = { 8, hot, 65536, 512, 1, 4096, GGML_TYPE_F16 };
            page_runner r(be, c, store.data);
            if (!r.supported) {
                std::printf("  %s %s: not supported\n", c.name().c_str(), ggml_backend_dev_name(dev));
            }
            for (int miss_every : { 0, 16, 1 }) {  // 0: no misses after the first step
                if (!r.supported) break;
                int32_t step = 1000 * (miss_every + 1);
                page_step st;
                st.n_vis.assign(c.ns, (int32_t) c.n_blocks);
                int32_t shift = 0;
                double total_us = 0.0;
                const int reps = 20;
                for (int rep = -1; rep < reps; ++rep) {
                    st.step = ++step;
                    st.blocks.clear();
                    // the selection moves by one block in every miss_every, i.e. 1/miss_every misses
                    shift += miss_every == 1 ? (int32_t) c.kb : miss_every ? (int32_t) (c.kb / miss_every) : 0;
                    for (int64_t s = 0; s < c.ns; ++s)
                        for (int64_t j = 0; j < c.kb; ++j) st.blocks.push_back((int32_t) ((shift + j) % c.n_blocks));
                    const auto t0 = std::chrono::steady_clock::now();
                    r.run(st);
                    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
                    if (rep >= 0) total_us += us;  // rep -1 fills the cache
                }
                const double misses = miss_every ? (double) c.kb / miss_every * c.ns : 0.0;
                std::printf("  %s %s: %.1f us/step, %.0f misses/step (%.1f MiB fetched, %.1f GB/s)\n", c.name().c_str(),
                            ggml_backend_dev_name(dev), total_us / reps, misses, misses * c.B() / 1048576.0,
                            misses * c.B() / (total_us / reps) / 1e3);
            }
        }
        std::fflush(stdout);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            perf_prefetch(be, ggml_backend_dev_name(dev));
            // the default hot cache (1024) and a 4x larger one, at 512- and 2048-token chunks
            for (const auto & [hot, n_q] : { std::pair<int64_t, int64_t>{ 1024, 512 }, { 4096, 512 }, { 1024, 2048 }, { 4096, 2048 } }) {
                perf_prefill_attention(be, ggml_backend_dev_name(dev), hot, n_q);
            }
        }
        ggml_backend_free(be);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv,
                         { { "test", cmd_test }, { "perf", cmd_perf }, { "trace", [](const char *) { return cmd_trace(); } } });
}
