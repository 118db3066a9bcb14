// The MoE expert products of prefill batches (MUL_MAT_ID with f16 experts) on pyqsa's grouped
// GEMM, read by the patched ggml-cuda.cu (ggml_patches/0013). Upstream's MMF kernel, which pyqsa
// keeps at every batch (0010), is built for a few columns: at 2048 tokens it reached ~33 TFLOP/s
// on Flash-Next's experts (test-products perf), some 44 ms of a 2048-token batch's kernels. Here
// the tokens are grouped by expert on the device (no host sync), each expert's rows padded to a
// tile, and every (tile, 128 output columns) is one CTA of f16 tensor-core products summed in f32
// from a 3-stage cp.async pipeline: the same products as MMF (activations rounded to f16, f32
// sums), in large tiles.
//
// Taken when the experts are f16 with K % 64 == 0 and N % 128 == 0, there are at most 1024 of
// them, and the batch has at least PYQSA_MOE_GEMM_MIN_TOKENS tokens and PYQSA_MOE_GEMM_MIN_ROWS
// routed rows per expert (on the H200 MMF was faster at 128 tokens of 8 experts, 38.4 against
// 47.9 us, and slower at 512, 90.9 against 50.7); smaller batches and every other shape stay on
// MMF. PYQSA_CUDA_MOE_MMF=1 keeps every call on MMF and PYQSA_CUDA_MOE_SYNC=1 on upstream's
// choice (read at every call: test-products checks and times each way); PYQSA_CUDA_MOE_BM=64 or
// 128 fixes the tile height (otherwise 128 when the experts average 128 rows or more and 128-row
// tiles give at least two CTAs an SM, else 64), for test-products' checks and timings.
#pragma once

#include "ggml-cuda/common.cuh"

constexpr int64_t PYQSA_MOE_GEMM_MIN_ROWS = 16;
constexpr int64_t PYQSA_MOE_GEMM_MIN_TOKENS = 256;

// runs dst (a MUL_MAT_ID) and returns true, or returns false (nothing launched) for upstream's kernels
bool pyqsa_cuda_moe_gemm(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
