// Sampling inside llama_decode through llama.cpp's backend sampling: a sampler chain holding one
// sampler whose backend_apply adds the sample op (native/include/pyqsa-ggml.h) for its
// sequence's output row, so only the 168-byte result of a row leaves the device, not the
// row's n_vocab logits (see pyqsa_sampler_new in pyqsa.h).
#include "pyqsa.h"

#include "ggml-backend.h"
#include "llama.h"
#include "pyqsa-ggml.h"

#include <cstring>
#include <vector>

namespace {

struct device_sampler {
    // the parameters of the sequence's next draw; greedy without log-probabilities until set
    pyqsa_sample_params             params = { 0.0f, 0, 1.0f, 0.0f, 0u, 0u, 0u, -1 };
    int32_t                         max_adjust = 0;
    std::vector<pyqsa_logit_adjust> adjust;  // the next draw's logit adjustments
    // the inputs of the graph being built: I32 [8 + 4 * max_adjust] each, the params and then the
    // adjustment list, so a draw's inputs go to the device in one copy (each is a synchronous
    // one: llama.cpp sets every sequence's sampler inputs before a step's pass starts)
    std::vector<ggml_tensor *>      inputs;
    std::vector<int32_t>            staged;  // what set_input copies, reused
};

device_sampler * state(const llama_sampler * s) {
    return static_cast<device_sampler *>(s->ctx);
}

const char * sampler_name(const llama_sampler *) {
    return "pyqsa-sample";
}

// on a host llama_token_data_array (llama_sampler_sample): the same rules over its logits, ranks
// by position (llama.cpp lists the whole vocabulary in id order)
void sampler_apply(llama_sampler * s, llama_token_data_array * cur) {
    std::vector<float> x(cur->size);
    for (size_t i = 0; i < cur->size; ++i) {
        x[i] = cur->data[i].logit;
    }
    const device_sampler * st = state(s);
    pyqsa_sample_params    p  = st->params;
    p.n_top                   = -1;
    pyqsa_sample_result r;
    pyqsa_sample_row(x.data(), (int64_t) x.size(), &p, st->adjust.data(), (int64_t) st->adjust.size(), &r);
    cur->selected = r.token;
}

llama_sampler * sampler_clone(const llama_sampler * s);

void sampler_free(llama_sampler * s) {
    delete state(s);
}

bool sampler_backend_init(llama_sampler *, ggml_backend_buffer_type_t, uint32_t) {
    return true;  // a backend without the op runs it on the CPU (the scheduler's fallback)
}

void sampler_backend_apply(llama_sampler * s, ggml_context * ctx, ggml_cgraph *, llama_sampler_data * data) {
    device_sampler * st = state(s);
    ggml_tensor *    in = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 8 + 4 * (int64_t) st->max_adjust);
    ggml_format_name(in, "pyqsa_sample_inputs_%zu", st->inputs.size());
    ggml_set_input(in);
    st->inputs.push_back(in);
    ggml_tensor * p      = ggml_view_1d(ctx, in, 8, 0);
    ggml_tensor * adjust = nullptr;
    if (st->max_adjust > 0) {
        adjust = ggml_view_3d(ctx, in, 4, st->max_adjust, 1, sizeof(pyqsa_logit_adjust),
                              st->max_adjust * sizeof(pyqsa_logit_adjust), sizeof(pyqsa_sample_params));
    }
    ggml_tensor * out = pyqsa_ggml_sample(ctx, data->logits, p, adjust);  // I32 [42, 1]
    data->sampled     = ggml_view_1d(ctx, out, 1, 0);
    data->candidates  = out;      // the whole result, read back by pyqsa_sampled_get
    data->logits      = nullptr;  // no copy of the row's logits
}

void sampler_backend_set_input(llama_sampler * s) {
    device_sampler * st = state(s);
    // the params, the list and its end (an entry with id -1) unless it fills the input: what
    // lies past the end is whatever the buffer held, and no kernel reads it
    const pyqsa_logit_adjust end = { -1, 0.0f, 1.0f, 0.0f };
    const size_t             n   = st->adjust.size();
    const size_t             len = n + (n < (size_t) st->max_adjust ? 1 : 0);
    st->staged.resize((sizeof(st->params) + len * sizeof(end)) / sizeof(int32_t));
    char * dst = reinterpret_cast<char *>(st->staged.data());
    std::memcpy(dst, &st->params, sizeof(st->params));
    if (n > 0) {
        std::memcpy(dst + sizeof(st->params), st->adjust.data(), n * sizeof(end));
    }
    if (len > n) {
        std::memcpy(dst + sizeof(st->params) + n * sizeof(end), &end, sizeof(end));
    }
    for (ggml_tensor * in : st->inputs) {
        ggml_backend_tensor_set(in, st->staged.data(), 0, st->staged.size() * sizeof(int32_t));
    }
}

void sampler_backend_reset(llama_sampler * s) {
    state(s)->inputs.clear();
}

llama_sampler_i sampler_iface = {
    /* .name              = */ sampler_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ sampler_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ sampler_clone,
    /* .free              = */ sampler_free,
    /* .backend_init      = */ sampler_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ sampler_backend_apply,
    /* .backend_set_input = */ sampler_backend_set_input,
    /* .backend_reset     = */ sampler_backend_reset,
    /* .copy_state        = */ nullptr,
};

llama_sampler * sampler_clone(const llama_sampler * s) {
    return llama_sampler_init(&sampler_iface, new device_sampler(*state(s)));
}

}  // namespace

void * pyqsa_sampler_new(int32_t max_adjust) {
    if (max_adjust < 0 || max_adjust > 65536) {
        return nullptr;
    }
    auto * st       = new device_sampler;
    st->max_adjust  = max_adjust;
    // llama_set_sampler offloads chains only
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(chain, llama_sampler_init(&sampler_iface, st));
    return chain;
}

void pyqsa_sampler_free(void * sampler) {
    if (sampler != nullptr) {
        llama_sampler_free(static_cast<llama_sampler *>(sampler));
    }
}

int32_t pyqsa_sampler_set(void * sampler, const pyqsa_sample_params * params, const pyqsa_logit_adjust * adjust,
                          int32_t n_adjust) {
    if (sampler == nullptr || params == nullptr || params->n_top < -1 || params->n_top > 20 || n_adjust < 0 ||
        (n_adjust > 0 && adjust == nullptr)) {
        return PYQSA_ERR_INVALID_ARG;
    }
    llama_sampler * own = llama_sampler_chain_get(static_cast<llama_sampler *>(sampler), 0);
    if (own == nullptr || own->iface != &sampler_iface || n_adjust > state(own)->max_adjust) {
        return PYQSA_ERR_INVALID_ARG;
    }
    device_sampler * st = state(own);
    st->params          = *params;
    st->adjust.assign(adjust, adjust + n_adjust);
    return PYQSA_OK;
}

int32_t pyqsa_sampler_attach(void * ctx, int32_t seq_id, void * sampler) {
    if (ctx == nullptr || seq_id < 0) {
        return PYQSA_ERR_INVALID_ARG;
    }
    const bool ok = llama_set_sampler(static_cast<llama_context *>(ctx), seq_id, static_cast<llama_sampler *>(sampler));
    return ok || sampler == nullptr ? PYQSA_OK : PYQSA_ERR_UNSUPPORTED;
}

int32_t pyqsa_sampled_get(void * ctx, int32_t i, pyqsa_sample_result * out) {
    if (ctx == nullptr || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    auto *               lctx = static_cast<llama_context *>(ctx);
    const llama_token *  data = llama_get_sampled_candidates_ith(lctx, i);
    if (data == nullptr || llama_get_sampled_candidates_count_ith(lctx, i) != sizeof(*out) / sizeof(int32_t)) {
        return PYQSA_ERR_OUT_OF_RANGE;
    }
    std::memcpy(out, data, sizeof(*out));
    return PYQSA_OK;
}
