// Prefill kernel for upstream's GGML_OP_GATED_DELTA_NET (see gated-delta-net.cu), called from the
// patched ggml-cuda/gated_delta_net.cu (ggml_patches/0010-cuda-gdn-prefill-hook).
#pragma once

#include "ggml-cuda/common.cuh"

// ubatches of at least this many tokens per sequence take pyqsa's kernel (decode keeps upstream's)
#define PYQSA_GDN_PREFILL_MIN_TOKENS 16

// Runs dst's recurrence (scalar gate, one state out, written to state_out) on pyqsa's kernel when
// it suits (S_v = 128, at least PYQSA_GDN_PREFILL_MIN_TOKENS tokens, 16-byte aligned q, k and v
// rows, sm_80 or later, PYQSA_GDN_PREFILL not 0); false, having done nothing, otherwise.
bool pyqsa_cuda_gated_delta_net(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, float * state_out);
