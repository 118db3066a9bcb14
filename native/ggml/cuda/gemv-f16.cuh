// Products of f16 weights with one activation column: a decode step of one sequence. Read by the
// patched ggml-cuda.cu (ggml_patches/0015) before upstream's choice of kernel:
//   MUL_MAT     dst [N] = w [K, N] x [K], N large enough for two rows a warp and two CTAs an SM
//   MUL_MAT_ID  dst [N, n_used] = expert ids[u] of w [K, N, n_expert] times x [K, x_ne1] row
//               u % x_ne1 (the MoE experts of one token)
// Upstream runs these on MMVF, which sums f16 weights in f16 on Hopper and loads 4 bytes a thread
// (test-products perf on the H200, 2560 x 12288: 1.76 TB/s of weights; the 151936-row output
// layer 2.6 TB/s). Here each warp streams R rows of w in 16-byte loads, the first ones prefetched
// into L2 before the launch waits for the kernel before it (PDL), and sums in f32; x stays f32.
// 2-8 columns stay on upstream's MMF: a first version of this kernel for them, f32 FMAs on CUDA
// cores, ran 1.4-2.6x slower than MMF's tensor cores there (test-products perf, decode.py at 8
// sequences 27.3 ms a step against 18.0).
// PYQSA_CUDA_GEMV_UPSTREAM=1 leaves every call to upstream's kernels (read at every call, so that
// test-products checks and times both ways in one process).
#pragma once

#include "ggml-cuda/common.cuh"

// runs the MUL_MAT dst = w x and returns true, or returns false (nothing launched)
bool pyqsa_cuda_gemv(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, ggml_tensor * dst);

// runs the MUL_MAT_ID dst and returns true, or returns false (nothing launched)
bool pyqsa_cuda_gemv_id(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
