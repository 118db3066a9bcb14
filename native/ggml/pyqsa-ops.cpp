// Graph constructors of the pyqsa ggml ops (see native/include/pyqsa-ggml.h).
#include "pyqsa-ggml.h"

#include "ggml-impl.h"

#include <initializer_list>

namespace {

// result as pyqsa sub-op `sub` of the given sources, in order
struct ggml_tensor * as_op(struct ggml_tensor * result, enum pyqsa_ggml_op sub,
                           std::initializer_list<struct ggml_tensor *> srcs) {
    ggml_set_op_params_i32(result, 0, sub);
    result->op = GGML_OP_PYQSA;
    int i      = 0;
    for (struct ggml_tensor * src : srcs) {
        result->src[i++] = src;
    }
    return result;
}

// a host address as two 32-bit op params, from index i on
void set_host_ptr(struct ggml_tensor * op, int i, const void * p) {
    const uint64_t addr = (uint64_t) (uintptr_t) p;
    ggml_set_op_params_i32(op, i, (int32_t) (uint32_t) (addr & 0xffffffffu));
    ggml_set_op_params_i32(op, i + 1, (int32_t) (uint32_t) (addr >> 32));
}

// The rows a fetching op (page resolve, page stage) copies blocks into and the host stores it
// copies them from: checked as a pair, then n_store and both addresses into params 1-5 (read
// back by pyqsa_ggml_qsa_page_store).
void set_stores(struct ggml_tensor * op, const struct ggml_tensor * dev, const void * store,
                const struct ggml_tensor * dev_v, const void * store_v, int64_t n_store) {
    // a block is one contiguous row; streams may sit further apart (a view of a larger tensor)
    GGML_ASSERT(dev->nb[1] == ggml_row_size(dev->type, dev->ne[0]));
    GGML_ASSERT(store != nullptr && n_store > 0 && n_store <= INT32_MAX);
    GGML_ASSERT((dev_v == nullptr) == (store_v == nullptr));
    GGML_ASSERT(dev_v == nullptr ||
                (ggml_are_same_shape(dev_v, dev) && dev_v->nb[1] == dev->nb[1] && dev_v->nb[2] == dev->nb[2]));
    ggml_set_op_params_i32(op, 1, (int32_t) n_store);
    set_host_ptr(op, 2, store);
    set_host_ptr(op, 4, store_v);
}

// the inputs of qsa_attn and qsa_attn_part
void check_attn_inputs(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v, const ggml_tensor * cells) {
    GGML_ASSERT(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float));  // any row strides: q may be a view
    GGML_ASSERT(cells->type == GGML_TYPE_I32);
    GGML_ASSERT(k->type == v->type);
    GGML_ASSERT(k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_Q8_0);
    GGML_ASSERT(k->ne[0] == q->ne[0] && v->ne[0] == q->ne[0]);
    GGML_ASSERT(k->ne[1] == v->ne[1] && q->ne[1] % k->ne[1] == 0);
    GGML_ASSERT(k->ne[2] == v->ne[2] && k->ne[3] == v->ne[3] && k->ne[3] == q->ne[3]);
    GGML_ASSERT(cells->ne[1] == q->ne[2] && cells->ne[2] == q->ne[3]);
    GGML_ASSERT(ggml_is_contiguous(cells));
    // one contiguous row per (head, cell), so a row can be read or dequantized in one go
    GGML_ASSERT(k->nb[0] == ggml_type_size(k->type) && v->nb[0] == ggml_type_size(v->type));
}

}  // namespace

void * pyqsa_ggml_host_ptr(const struct ggml_tensor * op, int first_param) {
    const uint64_t lo = (uint32_t) ggml_get_op_params_i32(op, first_param);
    const uint64_t hi = (uint32_t) ggml_get_op_params_i32(op, first_param + 1);
    return (void *) (uintptr_t) (lo | (hi << 32));
}

struct ggml_tensor * pyqsa_ggml_qsa_attn(struct ggml_context * ctx, struct ggml_tensor * q,
                                         struct ggml_tensor * k, struct ggml_tensor * v,
                                         struct ggml_tensor * cells, float scale) {
    check_attn_inputs(q, k, v, cells);

    struct ggml_tensor * result = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, q->ne[0], q->ne[1], q->ne[2], q->ne[3]);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_ATTN);
    ggml_set_op_params_f32(result, 1, scale);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = q;
    result->src[1] = k;
    result->src[2] = v;
    result->src[3] = cells;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_mask_cells(struct ggml_context * ctx, struct ggml_tensor * mask,
                                               int64_t n_sel) {
    GGML_ASSERT(mask->type == GGML_TYPE_F32 || mask->type == GGML_TYPE_F16);
    GGML_ASSERT(mask->ne[2] == 1 && n_sel > 0);
    GGML_ASSERT(mask->nb[0] == ggml_type_size(mask->type));

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, n_sel, mask->ne[1], mask->ne[3]);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_MASK_CELLS);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = mask;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_score(struct ggml_context * ctx, struct ggml_tensor * q,
                                          struct ggml_tensor * keys, float scale) {
    GGML_ASSERT(q->type == GGML_TYPE_F32 && keys->type == GGML_TYPE_F32);
    GGML_ASSERT(q->nb[0] == sizeof(float) && keys->nb[0] == sizeof(float));
    GGML_ASSERT(keys->ne[0] == q->ne[0] && keys->ne[2] == q->ne[3] && keys->ne[3] == 1);

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, keys->ne[1], q->ne[2], q->ne[3]);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_SCORE);
    ggml_set_op_params_f32(result, 1, scale);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = q;
    result->src[1] = keys;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_topk(struct ggml_context * ctx, struct ggml_tensor * score,
                                         struct ggml_tensor * n_vis, int64_t k) {
    GGML_ASSERT(score->type == GGML_TYPE_F32 && ggml_is_contiguous(score));
    GGML_ASSERT(k > 0 && k <= score->ne[0]);
    GGML_ASSERT(n_vis == nullptr || (n_vis->type == GGML_TYPE_I32 && ggml_nelements(n_vis) == ggml_nrows(score)));

    struct ggml_tensor * result = ggml_new_tensor_4d(ctx, GGML_TYPE_I32, k, score->ne[1], score->ne[2], score->ne[3]);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_TOPK);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = score;
    result->src[1] = n_vis;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_block_cells(struct ggml_context * ctx, struct ggml_tensor * blocks,
                                                struct ggml_tensor * n_vis, struct ggml_tensor * pos,
                                                int32_t r) {
    GGML_ASSERT(blocks->type == GGML_TYPE_I32 && ggml_is_contiguous(blocks));
    GGML_ASSERT(n_vis->type == GGML_TYPE_I32 && pos->type == GGML_TYPE_I32);
    GGML_ASSERT(ggml_nelements(n_vis) == ggml_nrows(blocks) && ggml_nelements(pos) == ggml_nrows(blocks));
    GGML_ASSERT(r > 0);

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, blocks->ne[0] * r + r - 1, blocks->ne[1], blocks->ne[2]);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_BLOCK_CELLS);
    ggml_set_op_params_i32(result, 1, r);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = blocks;
    result->src[1] = n_vis;
    result->src[2] = pos;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_block_cells_paged(struct ggml_context * ctx, struct ggml_tensor * blocks,
                                                      struct ggml_tensor * slots, struct ggml_tensor * n_vis,
                                                      struct ggml_tensor * n_paged, struct ggml_tensor * pos,
                                                      int32_t r, int32_t hot_cells, int32_t ring) {
    GGML_ASSERT(slots->type == GGML_TYPE_I32 && ggml_are_same_shape(slots, blocks) && ggml_is_contiguous(slots));
    GGML_ASSERT(n_paged->type == GGML_TYPE_I32 && ggml_nelements(n_paged) == ggml_nrows(blocks));
    GGML_ASSERT(hot_cells >= 0 && hot_cells % r == 0 && ring >= r);

    struct ggml_tensor * result = pyqsa_ggml_qsa_block_cells(ctx, blocks, n_vis, pos, r);
    ggml_set_op_params_i32(result, 2, hot_cells);
    ggml_set_op_params_i32(result, 3, ring);
    result->src[3] = slots;
    result->src[4] = n_paged;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_page_resolve(struct ggml_context * ctx, struct ggml_tensor * blocks,
                                                 struct ggml_tensor * n_vis, struct ggml_tensor * table,
                                                 struct ggml_tensor * owner, struct ggml_tensor * stamp,
                                                 struct ggml_tensor * step, struct ggml_tensor * stats,
                                                 struct ggml_tensor * hot, const void * store,
                                                 struct ggml_tensor * hot_v, const void * store_v, int64_t n_store) {
    const int64_t kb = blocks->ne[0], n_q = blocks->ne[1], ns = blocks->ne[2];
    const int64_t H  = owner->ne[0];
    for (const ggml_tensor * t : { blocks, n_vis, table, owner, stamp, step }) {
        GGML_ASSERT(t->type == GGML_TYPE_I32 && ggml_is_contiguous(t));
    }
    GGML_ASSERT(stats->type == GGML_TYPE_I64 && ggml_is_contiguous(stats));
    GGML_ASSERT(blocks->ne[3] == 1 && ggml_nelements(n_vis) == n_q * ns);
    GGML_ASSERT(ggml_nelements(step) == 1 || ggml_nelements(step) == 1 + ns);
    GGML_ASSERT(table->ne[1] == ns && owner->ne[1] == ns && stamp->ne[0] == H && stamp->ne[1] == ns);
    GGML_ASSERT(stats->ne[0] == 2 && stats->ne[1] == ns);
    GGML_ASSERT(hot->ne[1] == H && hot->ne[2] == ns);
    GGML_ASSERT(H >= kb * n_q && "pyqsa: the hot cache must hold every block one step selects");
    GGML_ASSERT(table->ne[0] <= n_store);

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, kb, n_q, ns);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_PAGE_RESOLVE);
    set_stores(result, hot, store, hot_v, store_v, n_store);
    result->op = GGML_OP_PYQSA;
    ggml_tensor * srcs[] = { blocks, n_vis, table, owner, stamp, step, stats, hot, hot_v };
    for (int i = 0; i < 9; ++i) {
        result->src[i] = srcs[i];
    }
    return result;
}

void pyqsa_ggml_qsa_page_resolve_set_generations(struct ggml_tensor * resolve, struct ggml_tensor * seen) {
    GGML_ASSERT(resolve->op == GGML_OP_PYQSA && ggml_get_op_params_i32(resolve, 0) == PYQSA_GGML_OP_QSA_PAGE_RESOLVE);
    const int64_t ns = resolve->src[0]->ne[2];
    GGML_ASSERT(ggml_nelements(resolve->src[5]) == 1 + ns);
    GGML_ASSERT(seen->type == GGML_TYPE_I32 && ggml_is_contiguous(seen) && ggml_nelements(seen) == ns);
    resolve->src[9] = seen;
}

struct ggml_tensor * pyqsa_ggml_qsa_page_stage(struct ggml_context * ctx, struct ggml_tensor * blocks,
                                               struct ggml_tensor * n_paged, struct ggml_tensor * stage,
                                               const void * store, struct ggml_tensor * stage_v, const void * store_v,
                                               int64_t n_store, int64_t b0, struct ggml_tensor * after,
                                               struct ggml_tensor * tally) {
    const int64_t ns = blocks->ne[2];
    GGML_ASSERT(blocks->type == GGML_TYPE_I32 && ggml_is_contiguous(blocks) && blocks->ne[3] == 1);
    GGML_ASSERT(n_paged->type == GGML_TYPE_I32 && ggml_is_contiguous(n_paged) && ggml_nelements(n_paged) == ggml_nrows(blocks));
    GGML_ASSERT(stage->ne[2] == ns && b0 >= 0 && b0 < n_store);
    GGML_ASSERT(tally == nullptr || (tally->type == GGML_TYPE_I64 && ggml_is_contiguous(tally) && ggml_nelements(tally) == ns));

    struct ggml_tensor * result = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, ns);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_PAGE_STAGE);
    set_stores(result, stage, store, stage_v, store_v, n_store);
    ggml_set_op_params_i32(result, 6, (int32_t) b0);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = blocks;
    result->src[1] = n_paged;
    result->src[2] = stage;
    result->src[3] = stage_v;
    result->src[4] = after;
    result->src[5] = tally;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_attn_part(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                              struct ggml_tensor * v, struct ggml_tensor * cells,
                                              struct ggml_tensor * n_paged, struct ggml_tensor * state,
                                              struct ggml_tensor * after, float scale, int32_t r, int32_t lo,
                                              int32_t hi, int32_t base, int32_t ring, bool last) {
    check_attn_inputs(q, k, v, cells);
    const int64_t D = q->ne[0], H = q->ne[1], n_rows = q->ne[2] * q->ne[3];
    GGML_ASSERT(n_paged->type == GGML_TYPE_I32 && ggml_is_contiguous(n_paged) && ggml_nelements(n_paged) == n_rows);
    GGML_ASSERT(r > 0 && ring >= 0 && (ring > 0 || (lo >= 0 && lo <= hi)));
    const int64_t n_split = pyqsa_ggml_qsa_attn_cuda_splits(cells->ne[0], n_rows, H);
    GGML_ASSERT(state == nullptr || (state->type == GGML_TYPE_F32 && ggml_is_contiguous(state) &&
                                     state->ne[0] == D + 2 && state->ne[1] == H && state->ne[2] == n_rows &&
                                     state->ne[3] == n_split));

    struct ggml_tensor * result = last ? ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, H, q->ne[2], q->ne[3])
                                       : ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D + 2, H, n_rows, n_split);
    const int32_t params[] = { PYQSA_GGML_OP_QSA_ATTN_PART, 0, r, lo, hi, base, ring, last };
    for (int i = 0; i < 8; ++i) {
        ggml_set_op_params_i32(result, i, params[i]);
    }
    ggml_set_op_params_f32(result, 1, scale);
    result->op = GGML_OP_PYQSA;
    ggml_tensor * srcs[] = { q, k, v, cells, n_paged, state, after };
    for (int i = 0; i < 7; ++i) {
        result->src[i] = srcs[i];
    }
    return result;
}

const void * pyqsa_ggml_qsa_page_store(const struct ggml_tensor * op, int i, int64_t * n_store) {
    *n_store = ggml_get_op_params_i32(op, 1);
    return pyqsa_ggml_host_ptr(op, 2 + 2 * i);
}

struct ggml_tensor * pyqsa_ggml_qsa_page_write(struct ggml_context * ctx, struct ggml_tensor * k,
                                               struct ggml_tensor * v, struct ggml_tensor * src_rows,
                                               struct ggml_tensor * k_rows, struct ggml_tensor * v_rows,
                                               void * k_host, void * v_host) {
    GGML_ASSERT(k_host != nullptr && v_host != nullptr);
    GGML_ASSERT(ggml_are_same_shape(k, v) && k->type == v->type && k->nb[1] == v->nb[1]);
    GGML_ASSERT(k->nb[1] == ggml_row_size(k->type, k->ne[0]) && k->ne[2] == 1 && k->ne[3] == 1);
    for (const ggml_tensor * t : { k_rows, v_rows, src_rows }) {
        GGML_ASSERT(t == nullptr ||
                    (t->type == GGML_TYPE_I64 && ggml_is_contiguous(t) && ggml_nelements(t) == ggml_nelements(k_rows)));
    }
    GGML_ASSERT(src_rows != nullptr || ggml_nelements(k_rows) <= k->ne[1]);

    struct ggml_tensor * result = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_PAGE_WRITE);
    set_host_ptr(result, 2, k_host);
    set_host_ptr(result, 4, v_host);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = k;
    result->src[1] = v;
    result->src[2] = src_rows;
    result->src[3] = k_rows;
    result->src[4] = v_rows;
    return result;
}

const struct ggml_tensor * pyqsa_ggml_qsa_page_rows(const struct ggml_tensor * op) {
    switch (ggml_get_op_params_i32(op, 0)) {
        case PYQSA_GGML_OP_QSA_PAGE_RESOLVE:
            return op->src[7];
        case PYQSA_GGML_OP_QSA_PAGE_STAGE:
            return op->src[2];
        case PYQSA_GGML_OP_QSA_PAGE_WRITE:
            return op->src[0];
        default:
            GGML_ABORT("pyqsa: not a page node");
    }
}

// op param 7: the store's type + 1, 0 for the device rows' own
void pyqsa_ggml_qsa_page_set_store_type(struct ggml_tensor * op, enum ggml_type type) {
    const int32_t       sub  = ggml_get_op_params_i32(op, 0);
    const ggml_tensor * rows = pyqsa_ggml_qsa_page_rows(op);
    if (type != rows->type) {
        // the one conversion each way: f16 rows of a q8_0 store, and f32 rows written into one
        GGML_ASSERT(type == GGML_TYPE_Q8_0 && rows->ne[0] % 32 == 0);
        GGML_ASSERT(rows->type == (sub == PYQSA_GGML_OP_QSA_PAGE_WRITE ? GGML_TYPE_F32 : GGML_TYPE_F16));
    }
    ggml_set_op_params_i32(op, 7, type == rows->type ? 0 : (int32_t) type + 1);
}

enum ggml_type pyqsa_ggml_qsa_page_store_type(const struct ggml_tensor * op) {
    const int32_t t = ggml_get_op_params_i32(op, 7);
    return t > 0 ? (enum ggml_type) (t - 1) : pyqsa_ggml_qsa_page_rows(op)->type;
}

size_t pyqsa_ggml_qsa_page_store_row(const struct ggml_tensor * op) {
    return ggml_row_size(pyqsa_ggml_qsa_page_store_type(op), pyqsa_ggml_qsa_page_rows(op)->ne[0]);
}

struct ggml_tensor * pyqsa_ggml_qsa_page_fetch(struct ggml_context * ctx, struct ggml_tensor * dst,
                                               const void * store, struct ggml_tensor * dst_v, const void * store_v,
                                               int64_t store_rows, struct ggml_tensor * after) {
    GGML_ASSERT(store != nullptr && store_v != nullptr && dst_v != nullptr);
    GGML_ASSERT(ggml_are_same_shape(dst, dst_v) && dst->type == dst_v->type && dst->ne[3] == 1);
    GGML_ASSERT(ggml_is_contiguous(dst) && ggml_is_contiguous(dst_v));
    GGML_ASSERT(dst->ne[1] <= store_rows && store_rows <= INT32_MAX);

    struct ggml_tensor * result = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_PAGE_FETCH);
    ggml_set_op_params_i32(result, 1, (int32_t) store_rows);
    set_host_ptr(result, 2, store);
    set_host_ptr(result, 4, store_v);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = dst;
    result->src[1] = dst_v;
    result->src[2] = after;
    return result;
}

struct ggml_tensor * pyqsa_ggml_qsa_page_fetch_wait(struct ggml_context * ctx, struct ggml_tensor * fetch,
                                                    struct ggml_tensor * area) {
    GGML_ASSERT(fetch->op == GGML_OP_PYQSA && ggml_get_op_params_i32(fetch, 0) == PYQSA_GGML_OP_QSA_PAGE_FETCH);
    GGML_ASSERT(area == fetch->src[0] || area == fetch->src[1]);

    // a view, as ggml_set_rows returns: readers depend on this node, and nothing is allocated
    struct ggml_tensor * result = ggml_view_tensor(ctx, area);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_QSA_PAGE_FETCH_WAIT);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = area;
    result->src[1] = fetch;
    return result;
}

struct ggml_tensor * pyqsa_ggml_sample(struct ggml_context * ctx, struct ggml_tensor * logits,
                                       struct ggml_tensor * params, struct ggml_tensor * adjust) {
    static_assert(sizeof(pyqsa_sample_params) == 8 * sizeof(int32_t), "params: 8 words a row");
    static_assert(sizeof(pyqsa_sample_result) == 42 * sizeof(int32_t), "result: 42 words a row");
    static_assert(sizeof(pyqsa_logit_adjust) == 4 * sizeof(int32_t), "adjustment: 4 words");
    GGML_ASSERT(logits->type == GGML_TYPE_F32 && params->type == GGML_TYPE_I32);
    GGML_ASSERT(logits->nb[0] == sizeof(float) && logits->ne[0] <= INT32_MAX);
    GGML_ASSERT(ggml_is_contiguous(params) && params->ne[0] == 8);
    GGML_ASSERT(ggml_nrows(logits) == ggml_nrows(params) && logits->ne[2] == 1 && logits->ne[3] == 1);
    GGML_ASSERT(adjust == nullptr || (adjust->type == GGML_TYPE_I32 && ggml_is_contiguous(adjust) &&
                                      adjust->ne[0] == 4 && adjust->ne[2] == logits->ne[1] && adjust->ne[3] == 1));

    struct ggml_tensor * result = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 42, logits->ne[1]);
    ggml_set_op_params_i32(result, 0, PYQSA_GGML_OP_SAMPLE);
    result->op     = GGML_OP_PYQSA;
    result->src[0] = logits;
    result->src[1] = params;
    result->src[2] = adjust;
    return result;
}

struct ggml_tensor * pyqsa_ggml_hc_combine(struct ggml_context * ctx, struct ggml_tensor * x,
                                           struct ggml_tensor * residual, struct ggml_tensor * inject,
                                           float scale) {
    for (const ggml_tensor * t : { x, residual, inject }) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float));
    }
    const int64_t n_embd = x->ne[0], hc = residual->ne[1], n_tokens = x->ne[1];
    GGML_ASSERT(x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(residual->ne[0] == n_embd && residual->ne[2] == n_tokens && residual->ne[3] == 1);
    GGML_ASSERT(inject->ne[0] == hc && inject->ne[1] == n_tokens && inject->ne[2] == 1 && inject->ne[3] == 1);

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n_embd, hc, n_tokens);
    ggml_set_op_params_f32(result, 1, scale);
    return as_op(result, PYQSA_GGML_OP_HC_COMBINE, { x, residual, inject });
}

struct ggml_tensor * pyqsa_ggml_silu_scaled(struct ggml_context * ctx, struct ggml_tensor * x, float scale) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float));

    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, x->ne);
    ggml_set_op_params_f32(result, 1, scale);
    return as_op(result, PYQSA_GGML_OP_SILU_SCALED, { x });
}

struct ggml_tensor * pyqsa_ggml_gdn_gates(struct ggml_context * ctx, struct ggml_tensor * alpha,
                                          struct ggml_tensor * beta, struct ggml_tensor * dt_bias,
                                          struct ggml_tensor * a) {
    for (const ggml_tensor * t : { alpha, beta, dt_bias, a }) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float));
    }
    GGML_ASSERT(ggml_are_same_shape(alpha, beta) && alpha->ne[3] == 1);
    GGML_ASSERT(ggml_is_contiguous(dt_bias) && ggml_is_contiguous(a));
    GGML_ASSERT(ggml_nelements(dt_bias) == alpha->ne[0] && ggml_nelements(a) == alpha->ne[0]);

    struct ggml_tensor * result = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, alpha->ne[0], alpha->ne[1], alpha->ne[2], 2);
    return as_op(result, PYQSA_GGML_OP_GDN_GATES, { alpha, beta, dt_bias, a });
}

struct ggml_tensor * pyqsa_ggml_add_gated(struct ggml_context * ctx, struct ggml_tensor * base, struct ggml_tensor * x,
                                          struct ggml_tensor * g) {
    for (const ggml_tensor * t : { base, x, g }) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float) && t->ne[2] == 1 && t->ne[3] == 1);
    }
    GGML_ASSERT(ggml_are_same_shape(base, x) && g->ne[0] == 1 && g->ne[1] == x->ne[1]);

    struct ggml_tensor * result = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1]);
    return as_op(result, PYQSA_GGML_OP_ADD_GATED, { base, x, g });
}

struct ggml_tensor * pyqsa_ggml_hc_combine_gated(struct ggml_context * ctx, struct ggml_tensor * base,
                                                 struct ggml_tensor * x, struct ggml_tensor * g,
                                                 struct ggml_tensor * residual, struct ggml_tensor * inject,
                                                 float scale) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && ggml_are_same_shape(base, x));
    GGML_ASSERT(g->type == GGML_TYPE_F32 && g->ne[0] == 1 && g->ne[1] == x->ne[1] && g->ne[2] == 1 && g->ne[3] == 1);
    // src[0..2] as the plain combine's (base in the block output's place), the join's x and g after
    struct ggml_tensor * result = pyqsa_ggml_hc_combine(ctx, base, residual, inject, scale);
    result->src[3]              = x;
    result->src[4]              = g;
    return result;
}

struct ggml_tensor * pyqsa_ggml_conv_step(struct ggml_context * ctx, struct ggml_tensor * state, struct ggml_tensor * x,
                                          struct ggml_tensor * kernel, struct ggml_tensor * store) {
    for (const ggml_tensor * t : { state, x, kernel, store }) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float));
    }
    const int64_t K = kernel->ne[0], C = kernel->ne[1], S = state->ne[2];
    GGML_ASSERT(K >= 2 && ggml_is_contiguous(kernel) && ggml_is_contiguous(state));
    GGML_ASSERT(state->ne[0] == K - 1 && state->ne[1] == C && state->ne[3] == 1);
    GGML_ASSERT(x->ne[0] == C && x->ne[1] == 1 && x->ne[2] == S && x->ne[3] == 1);
    GGML_ASSERT(store->ne[0] == (K - 1) * C && store->ne[1] == S && store->ne[2] == 1 && store->ne[3] == 1);

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, 1, S);
    return as_op(result, PYQSA_GGML_OP_CONV_STEP, { state, x, kernel, store });
}

struct ggml_tensor * pyqsa_ggml_rms_norm_gated(struct ggml_context * ctx, struct ggml_tensor * x, struct ggml_tensor * w,
                                               struct ggml_tensor * z, float eps) {
    for (const ggml_tensor * t : { x, w, z }) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float));
    }
    GGML_ASSERT(ggml_are_same_shape(x, z) && ggml_is_contiguous(w) && ggml_nelements(w) == x->ne[0]);

    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, x->ne);
    ggml_set_op_params_f32(result, 1, eps);
    return as_op(result, PYQSA_GGML_OP_RMS_NORM_GATED, { x, w, z });
}

bool pyqsa_hc_weight_type(enum ggml_type type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 ||
           (ggml_is_quantized(type) && ggml_get_type_traits(type)->to_float != nullptr);
}

struct ggml_tensor * pyqsa_ggml_hc_down(struct ggml_context * ctx, struct ggml_tensor * x, struct ggml_tensor * w_norm,
                                       struct ggml_tensor * w_down, struct ggml_tensor * w_inject, float eps,
                                       float scale) {
    const int64_t n_embd = x->ne[0], hc = x->ne[1], n_tokens = x->ne[2], lr = w_down->ne[1];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && x->ne[3] == 1);
    GGML_ASSERT(w_norm->type == GGML_TYPE_F32 && ggml_is_contiguous(w_norm));
    GGML_ASSERT(w_norm->ne[0] == n_embd && w_norm->ne[1] == hc && w_norm->ne[2] == 1 && w_norm->ne[3] == 1);
    GGML_ASSERT(pyqsa_hc_weight_type(w_down->type));
    GGML_ASSERT(w_inject->type == w_down->type && ggml_is_contiguous(w_down) && ggml_is_contiguous(w_inject));
    GGML_ASSERT(w_down->ne[0] == n_embd * hc && w_down->ne[2] == 1 && w_down->ne[3] == 1);
    GGML_ASSERT(w_inject->ne[0] == n_embd * hc && w_inject->ne[1] == hc && w_inject->ne[2] == 1 &&
                w_inject->ne[3] == 1);

    struct ggml_tensor * result = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, (lr + 2 * hc) * n_tokens);
    ggml_set_op_params_f32(result, 1, eps);
    ggml_set_op_params_f32(result, 2, scale);
    return as_op(result, PYQSA_GGML_OP_HC_DOWN, { x, w_norm, w_down, w_inject });
}

struct ggml_tensor * pyqsa_ggml_hc_pre(struct ggml_context * ctx, struct ggml_tensor * x, struct ggml_tensor * w_norm,
                                      struct ggml_tensor * w_up, struct ggml_tensor * down, float scale) {
    const int64_t n_embd = x->ne[0], hc = x->ne[1], n_tokens = x->ne[2], lr = w_up->ne[0];
    GGML_ASSERT(down->op == GGML_OP_PYQSA && ggml_get_op_params_i32(down, 0) == PYQSA_GGML_OP_HC_DOWN);
    GGML_ASSERT(down->src[0] == x && down->src[1] == w_norm && down->src[2]->ne[1] == lr);
    GGML_ASSERT(pyqsa_hc_weight_type(w_up->type));
    GGML_ASSERT(ggml_is_contiguous(w_up) && w_up->ne[1] == n_embd * hc && w_up->ne[2] == 1 && w_up->ne[3] == 1);

    struct ggml_tensor * result = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, n_tokens);
    ggml_set_op_params_f32(result, 1, scale);
    return as_op(result, PYQSA_GGML_OP_HC_PRE, { x, w_norm, w_up, down });
}
