// pyqsa C API: the importance-matrix collector (see native/include/pyqsa.h).
//
// The statistics are llama-imatrix's: for every weight matrix, the sum over the tokens of its
// product's input of each column's squared value, and the count of those tokens; a MUL_MAT_ID
// (MoE experts) keeps one sum row and one count per expert, over the tokens routed to it.
#include "pyqsa.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace {

// products of fewer rows are decode-like steps, not text: llama-imatrix skips them too
constexpr int64_t MIN_ROWS = 16;

struct entry {
    int64_t              n_cols = 0;
    std::vector<float>   sums;    // [n_mat][n_cols]
    std::vector<int64_t> counts;  // [n_mat]
};

struct collector {
    std::map<std::string, entry> entries;  // ordered: entry i is the i-th name
    std::string                  error;
    std::vector<char>            src1;  // host copy of a product's input on a device backend
    std::vector<int32_t>         ids;   // host copy of a MUL_MAT_ID's expert ids
};

// "CUDA0#blk.0.attn_q.weight#0" (a weight copied between backends) -> "blk.0.attn_q.weight"
std::string weight_name(const char * name) {
    const char * p = std::strchr(name, '#');
    if (p == nullptr) {
        return name;
    }
    const char * q = std::strchr(p + 1, '#');
    return q ? std::string(p + 1, q - p - 1) : std::string(p + 1);
}

bool wanted(const ggml_tensor * t) {
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    if (src1 == nullptr || src1->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float)) {
        return false;
    }
    if (t->op == GGML_OP_MUL_MAT_ID) {
        return true;
    }
    // weights only: the attention products' src0 are views of the caches, not "blk." tensors
    return t->op == GGML_OP_MUL_MAT && src1->ne[1] >= MIN_ROWS &&
           weight_name(src0->name).rfind("blk.", 0) == 0;
}

const char * host_data(const ggml_tensor * t, std::vector<char> & copy) {
    if (t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer)) {
        return static_cast<const char *>(t->data);
    }
    copy.resize(ggml_nbytes(t));
    ggml_backend_tensor_get(t, copy.data(), 0, copy.size());
    return copy.data();
}

void add_squares(float * acc, const char * row_bytes, int64_t n) {
    const auto * row = reinterpret_cast<const float *>(row_bytes);
    for (int64_t j = 0; j < n; ++j) {
        acc[j] += row[j] * row[j];
    }
}

bool finite(const float * v, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) {
            return false;
        }
    }
    return true;
}

bool fail(collector & c, const std::string & name, const char * what) {
    if (c.error.empty()) {
        c.error = name + ": " + what;
    }
    return false;
}

// src0: [n_cols, n_out, n_expert]; src1: [n_cols, n_used or 1 (broadcast), n_tokens];
// ids: [n_used, n_tokens], I32, not contiguous
bool collect_experts(collector & c, const ggml_tensor * t, const std::string & name) {
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    const ggml_tensor * ids  = t->src[2];
    const int64_t n_cols = src1->ne[0], n_expert = src0->ne[2];
    const int64_t n_used = ids->ne[0], n_tokens = src1->ne[2];
    if (ids->ne[1] != n_tokens || src1->ne[3] != 1) {
        return fail(c, name, "unexpected MUL_MAT_ID shapes");
    }
    entry & e = c.entries[name];
    if (e.sums.empty()) {
        e.n_cols = n_cols;
        e.sums.assign(n_cols * n_expert, 0.0f);
        e.counts.assign(n_expert, 0);
    } else if (e.n_cols != n_cols || (int64_t) e.counts.size() != n_expert) {
        return fail(c, name, "inconsistent sizes between products");
    }
    const char * x = host_data(src1, c.src1);
    c.ids.resize(ggml_nbytes(ids) / sizeof(int32_t));
    ggml_backend_tensor_get(ids, c.ids.data(), 0, ggml_nbytes(ids));
    const char * id_bytes = reinterpret_cast<const char *>(c.ids.data());
    std::vector<bool> touched(n_expert, false);
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
        for (int64_t k = 0; k < n_used; ++k) {
            const int32_t ex = *reinterpret_cast<const int32_t *>(id_bytes + tok * ids->nb[1] + k * ids->nb[0]);
            if (ex < 0 || ex >= n_expert) {
                return fail(c, name, "expert id out of range");
            }
            add_squares(e.sums.data() + ex * n_cols, x + (k % src1->ne[1]) * src1->nb[1] + tok * src1->nb[2], n_cols);
            e.counts[ex] += 1;
            touched[ex] = true;
        }
    }
    for (int64_t ex = 0; ex < n_expert; ++ex) {
        if (touched[ex] && !finite(e.sums.data() + ex * n_cols, n_cols)) {
            return fail(c, name, "non-finite activations");
        }
    }
    return true;
}

// src0: [n_cols, n_out, n2, n3] (n2 x n3 matrices, 1 for a 2-D weight); src1 broadcasts over them
bool collect_dense(collector & c, const ggml_tensor * t, const std::string & name) {
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    const int64_t n_cols = src1->ne[0], n_mat = src0->ne[2] * src0->ne[3];
    entry & e = c.entries[name];
    if (e.sums.empty()) {
        e.n_cols = n_cols;
        e.sums.assign(n_cols * n_mat, 0.0f);
        e.counts.assign(1, 0);  // one count: every matrix sees every row
    } else if (e.n_cols != n_cols || (int64_t) e.sums.size() != n_cols * n_mat || e.counts.size() != 1) {
        return fail(c, name, "inconsistent sizes between products");
    }
    const char * x = host_data(src1, c.src1);
    for (int64_t i3 = 0; i3 < src1->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < src1->ne[2]; ++i2) {
            const int64_t mat = (i3 % src0->ne[3]) * src0->ne[2] + (i2 % src0->ne[2]);
            float *       acc = e.sums.data() + mat * n_cols;
            const char *  mat_rows = x + i2 * src1->nb[2] + i3 * src1->nb[3];
            for (int64_t r = 0; r < src1->ne[1]; ++r) {
                add_squares(acc, mat_rows + r * src1->nb[1], n_cols);
            }
        }
    }
    e.counts[0] += ggml_nrows(src1) / n_mat;
    return finite(e.sums.data(), (int64_t) e.sums.size()) || fail(c, name, "non-finite activations");
}

}  // namespace

void * pyqsa_imatrix_new(void) {
    return new (std::nothrow) collector();
}

void pyqsa_imatrix_free(void * im) {
    delete static_cast<collector *>(im);
}

bool pyqsa_imatrix_collect(void * t, bool ask, void * im) {
    auto * tensor = static_cast<ggml_tensor *>(t);
    if (tensor == nullptr || im == nullptr) {
        return !ask;
    }
    auto & c = *static_cast<collector *>(im);
    if (ask) {
        return c.error.empty() && wanted(tensor);  // after an error, compute without stopping
    }
    if (!wanted(tensor)) {
        return true;
    }
    const std::string name = weight_name(tensor->src[0]->name);
    return tensor->op == GGML_OP_MUL_MAT_ID ? collect_experts(c, tensor, name) : collect_dense(c, tensor, name);
}

int32_t pyqsa_imatrix_n_entries(const void * im) {
    return im ? (int32_t) static_cast<const collector *>(im)->entries.size() : PYQSA_ERR_INVALID_ARG;
}

int32_t pyqsa_imatrix_entry(const void * im, int32_t i, char * name, size_t cap, int64_t * n_cols,
                            int64_t * n_mat, int64_t * n_counts) {
    if (im == nullptr || name == nullptr || cap == 0 || n_cols == nullptr || n_mat == nullptr ||
        n_counts == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const auto & c = *static_cast<const collector *>(im);
    if (i < 0 || i >= (int32_t) c.entries.size()) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    const auto it = std::next(c.entries.begin(), i);
    std::snprintf(name, cap, "%s", it->first.c_str());
    *n_cols   = it->second.n_cols;
    *n_mat    = (int64_t) it->second.sums.size() / it->second.n_cols;
    *n_counts = (int64_t) it->second.counts.size();
    return PYQSA_OK;
}

int32_t pyqsa_imatrix_read(const void * im, int32_t i, float * sums, int64_t * counts) {
    if (im == nullptr || sums == nullptr || counts == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const auto & c = *static_cast<const collector *>(im);
    if (i < 0 || i >= (int32_t) c.entries.size()) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    const entry & e = std::next(c.entries.begin(), i)->second;
    std::memcpy(sums, e.sums.data(), e.sums.size() * sizeof(float));
    std::memcpy(counts, e.counts.data(), e.counts.size() * sizeof(int64_t));
    return PYQSA_OK;
}

int32_t pyqsa_imatrix_error(const void * im, char * buf, size_t cap) {
    if (im == nullptr || buf == nullptr || cap == 0) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const auto & c = *static_cast<const collector *>(im);
    std::snprintf(buf, cap, "%s", c.error.c_str());
    return (int32_t) c.error.size();
}
