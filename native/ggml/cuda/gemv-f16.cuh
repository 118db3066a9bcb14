// Products of f16 weights with 1-8 activation columns: a decode step of 1-8 sequences. Read by
// the patched ggml-cuda.cu (ggml_patches/0015) before upstream's choice of kernel:
//   MUL_MAT     dst [N, T] = w [K, N] x [K, T], T <= 8
//   MUL_MAT_ID  dst [N, n_used, n_tok] = expert ids[u, t] of w [K, N, n_expert] times
//               x [K, x_ne1, n_tok] row u % x_ne1 of token t, n_tok <= 8 (the MoE experts)
// Upstream runs these on MMVF (one column; on Hopper it sums f16 weights in f16) and MMF (2-16
// columns on tensor-core tiles made for wider batches). bench/decode.py's profiles on the H200 had
// them at ~1 TB/s of weights, a fifth of what the memory gives, and half of an 8-sequence step.
// Here each warp streams R rows of w in 16-byte loads and keeps the sums of every column for them
// in f32 registers; x is read in f32 (not rounded to f16) through L1, which the CTA's warps share;
// a MoE expert's rows are read once for all the tokens routed to it (found on the device: no host
// sync, CUDA graphs stay valid). A column's sum runs in one order whatever the number of columns
// or rows a warp takes, so a sequence's products do not depend on which others share its step.
// PYQSA_CUDA_GEMV_UPSTREAM=1 leaves every call to upstream's kernels (read at every call, so that
// test-products checks and times both ways in one process).
#pragma once

#include "ggml-cuda/common.cuh"

// the most activation columns (tokens) a call takes
constexpr int PYQSA_GEMV_MAX_COLS = 8;

// runs the MUL_MAT dst = w x and returns true, or returns false (nothing launched)
bool pyqsa_cuda_gemv(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, ggml_tensor * dst);

// runs the MUL_MAT_ID dst and returns true, or returns false (nothing launched)
bool pyqsa_cuda_gemv_id(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
