// Decode-step products of one activation in one launch (see product-groups.cuh).
#include "product-groups.cuh"

#include "gemv-f16.cuh"

#include <atomic>
#include <map>
#include <vector>

namespace {

std::atomic<uint64_t> group_launches, grouped_products;

// upstream's fusions to a product (ggml_cuda_try_fuse) take nodes within this many after it: a bias
// or scale right after it, a GLU of a gate and an up product with their scales and biases
constexpr int FUSE_REACH = 13;

const ggml_tensor * base_of(const ggml_tensor * t) {
    return t->view_src ? t->view_src : t;
}

bool reads(const ggml_tensor * node, const ggml_tensor * t) {
    for (const ggml_tensor * src : node->src) {
        if (src == t) {
            return true;
        }
    }
    return false;
}

// node i: a MUL_MAT of weights the gemv reads (f16 or quantized) that no node computes and f32 x
// of 1-8 columns, with none of upstream's fusions to it (they need the nodes after it where the
// graph put them)
bool groupable(const ggml_cgraph * g, int i) {
    const ggml_tensor * n = g->nodes[i];
    if (n->op != GGML_OP_MUL_MAT || (n->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
        return false;
    }
    const ggml_tensor * w = n->src[0];
    const ggml_tensor * x = n->src[1];
    if (!pyqsa_cuda_gemv_reads(w->type) || w->op != GGML_OP_NONE || w->view_src != nullptr ||
        x->type != GGML_TYPE_F32 || n->type != GGML_TYPE_F32 || x->ne[1] > PYQSA_GEMV_MAX_COLS ||
        x->ne[2] != 1 || x->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1) {
        return false;
    }
    for (int k = 1; k <= FUSE_REACH && i + k < g->n_nodes; ++k) {
        const ggml_tensor * next = g->nodes[i + k];
        if (reads(next, n) &&
            (next->op == GGML_OP_GLU || (k == 1 && (next->op == GGML_OP_ADD || next->op == GGML_OP_MUL)))) {
            return false;
        }
    }
    return true;
}

// whether a node after a and before b writes where x lives (an in-place op, a copy or set into it)
bool writes_between(const ggml_cgraph * g, int a, int b, const ggml_tensor * x) {
    for (int i = a + 1; i < b; ++i) {
        if (base_of(g->nodes[i]) == base_of(x)) {
            return true;
        }
    }
    return false;
}

}  // namespace

void pyqsa_cuda_group_products(ggml_cgraph * g) {
    if (!pyqsa_cuda_products_grouped()) {
        return;
    }
    // groupable products by x and weight type (a launch reads one type), in order
    std::map<std::pair<const ggml_tensor *, ggml_type>, std::vector<int>> by_x;
    for (int i = 0; i < g->n_nodes; ++i) {
        if (groupable(g, i)) {
            by_x[{ g->nodes[i]->src[1], g->nodes[i]->src[0]->type }].push_back(i);
        }
    }
    std::vector<std::vector<int>> joins(g->n_nodes);  // an anchor's products, to follow it
    std::vector<bool>             moved(g->n_nodes, false);
    bool                          any = false;
    for (const auto & [key, products] : by_x) {
        const ggml_tensor * x      = key.first;
        int                 anchor = products[0];
        for (size_t k = 1; k < products.size(); ++k) {
            const int j = products[k];
            if ((int) joins[anchor].size() + 1 >= PYQSA_GEMV_MAX_PARTS || writes_between(g, anchor, j, x)) {
                anchor = j;  // a group of its own from here
                continue;
            }
            joins[anchor].push_back(j);
            moved[j] = true;
            any      = true;
        }
    }
    if (!any) {
        return;
    }
    std::vector<ggml_tensor *> order;
    order.reserve(g->n_nodes);
    for (int i = 0; i < g->n_nodes; ++i) {
        if (moved[i]) {
            continue;
        }
        order.push_back(g->nodes[i]);
        for (int j : joins[i]) {
            order.push_back(g->nodes[j]);
        }
    }
    std::copy(order.begin(), order.end(), g->nodes);
}

int pyqsa_cuda_try_group(ggml_backend_cuda_context & ctx, const ggml_cgraph * g, int i) {
    if (!pyqsa_cuda_products_grouped() || !groupable(g, i)) {
        return 0;
    }
    const ggml_tensor * x                             = g->nodes[i]->src[1];
    const ggml_tensor * dsts[PYQSA_GEMV_MAX_PARTS] = { g->nodes[i] };
    int                 n                             = 1;
    const ggml_type     type                          = g->nodes[i]->src[0]->type;
    while (n < PYQSA_GEMV_MAX_PARTS && i + n < g->n_nodes && g->nodes[i + n]->op == GGML_OP_MUL_MAT &&
           g->nodes[i + n]->src[1] == x && g->nodes[i + n]->src[0]->type == type && groupable(g, i + n)) {
        dsts[n] = g->nodes[i + n];
        ++n;
    }
    if (n < 2 || !pyqsa_cuda_gemv_group(ctx, dsts, n)) {
        return 0;
    }
    group_launches.fetch_add(1, std::memory_order_relaxed);
    grouped_products.fetch_add(n, std::memory_order_relaxed);
    return n - 1;
}

void pyqsa_cuda_group_counts(uint64_t * out) {
    out[0] = group_launches.load(std::memory_order_relaxed);
    out[1] = grouped_products.load(std::memory_order_relaxed);
}
