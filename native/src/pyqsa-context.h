// pyqsa's per-context settings inside libllama (see pyqsa_init_from_model in pyqsa.h).
//
// llama_context_params is upstream's public struct (and its Python binding's), so pyqsa's
// settings travel beside it: pyqsa_init_from_model parks them for the calling thread, and
// llama_context's constructor (ggml_patches/0008) takes them into llama_cparams::pyqsa before
// it creates the memory or builds a graph. A context created any other way gets the defaults.
#pragma once

#include "pyqsa.h"

// The settings parked for the context this thread is constructing (the defaults when it is not
// inside pyqsa_init_from_model); read by the constructor and by the memory it creates.
pyqsa_context_config pyqsa_context_config_take();

// The n_ubatch of the context this thread is constructing through pyqsa_init_from_model, else 0.
uint32_t pyqsa_context_building_n_ubatch();
