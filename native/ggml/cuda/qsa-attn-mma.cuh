#pragma once

#include "qsa-attn-warp.cuh"

// qsa_attn's output for `a` on tensor cores when the call suits them (f16 K/V, head dim 64, 128
// or 256, GQA groups of at most 16 heads, 16-byte aligned rows, at least
// sm_80 or later, PYQSA_QSA_ATTN_MMA not 0);
// false, having done nothing, otherwise
bool pyqsa_cuda_qsa_attn_mma(ggml_backend_cuda_context & ctx, const pyqsa_attn::args & a, ggml_type kv_type, int D,
                             int n_rows);
