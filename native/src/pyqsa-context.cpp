// pyqsa's per-context settings (see pyqsa-context.h).
#include "pyqsa-context.h"

#include "llama-context.h"

#include "ggml.h"

namespace {

thread_local pyqsa_context_config parked = pyqsa_context_config_default();
thread_local uint32_t             parked_n_ubatch = 0;

bool valid(const pyqsa_context_config & cfg) {
    const bool mode = cfg.qsa_mode == PYQSA_QSA_POSITIONAL || cfg.qsa_mode == PYQSA_QSA_SPARSE ||
                      cfg.qsa_mode == PYQSA_QSA_MASKED;
    const bool hot = cfg.hot_type == -1 || (cfg.hot_type == GGML_TYPE_F16 && cfg.hot_blocks > 0);
    return mode && hot && cfg.hot_blocks >= 0 && (cfg.hot_blocks == 0 || cfg.qsa_mode == PYQSA_QSA_POSITIONAL);
}

}  // namespace

pyqsa_context_config pyqsa_context_config_default(void) {
    pyqsa_context_config cfg{};
    cfg.qsa_mode = PYQSA_QSA_POSITIONAL;
    cfg.hot_type = -1;
    return cfg;
}

pyqsa_context_config pyqsa_context_config_take() {
    return parked;
}

uint32_t pyqsa_context_building_n_ubatch() {
    return parked_n_ubatch;
}

void * pyqsa_init_from_model(void * model, const void * params, const pyqsa_context_config * cfg, int32_t * err) {
    int32_t rc = PYQSA_OK;
    llama_context * ctx = nullptr;
    if (model == nullptr || params == nullptr || cfg == nullptr || !valid(*cfg)) {
        rc = PYQSA_ERR_INVALID_ARG;
    } else {
        const auto & p = *static_cast<const llama_context_params *>(params);
        parked          = *cfg;
        parked_n_ubatch = p.n_ubatch;
        ctx = llama_init_from_model(static_cast<llama_model *>(model), p);
        parked          = pyqsa_context_config_default();  // also when construction failed
        parked_n_ubatch = 0;
        rc = ctx ? PYQSA_OK : PYQSA_ERR_UNSUPPORTED;
    }
    if (err != nullptr) {
        *err = rc;
    }
    return ctx;
}

int32_t pyqsa_context_config_get(const void * ctx, pyqsa_context_config * out) {
    if (ctx == nullptr || out == nullptr) {
        return PYQSA_ERR_INVALID_ARG;
    }
    *out = static_cast<const llama_context *>(ctx)->get_cparams().pyqsa;
    return PYQSA_OK;
}
