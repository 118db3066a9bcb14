// Products of f16 weights with 1-8 activation columns: a decode step of 1-8 sequences; quantized
// weights (q4_0 .. q8_0, q4_K, q5_K, q6_K) likewise, each block dequantized in registers into the same
// f16 form (gemv-weights.cuh). Read by the patched ggml-cuda.cu (ggml_patches/0015) before
// upstream's choice of kernel:
//   MUL_MAT     dst [N, T] = w [K, N] x [K, T], T <= 8 (one column: N large enough for two rows
//               a warp and two CTAs an SM); or one column a channel, dst [N, 1, T] = w x [K, 1, T]
//   MUL_MAT_ID  dst [N, n_used, n_tok] = expert ids[u, t] of w [K, N, n_expert] times
//               x [K, x_ne1, n_tok] row u % x_ne1 of token t, n_tok <= 8 (the MoE experts)
// One column: upstream's MMVF sums f16 weights in f16 on Hopper and loads 4 bytes a thread
// (test-products perf on the H200, 2560 x 12288: 1.76 TB/s of weights; the output layer 2.6
// TB/s). Here each warp streams R rows of w in 16-byte loads, the first ones prefetched into L2
// before the launch waits for the kernel before it (PDL), and sums in f32; x stays f32.
// 2-8 columns: upstream's MMF tiles are made for wider batches (1.4-1.9 TB/s on Flash-Next's
// widest projections, under 1.1 on its experts). Here a CTA takes 16-64 rows and every column,
// its 2-8 warps splitting K, each lane loading 16 bytes of two rows and 32 of its column a step
// into m16n8k16 tensor-core products (x rounded to f16, as MMF and the CPU backend round it; f32
// sums); the form is picked for about 20 warps a SM, a narrow matrix's K split over a cluster;
// a MoE expert's rows are read once for all the tokens routed to it, found on the device (no host
// sync: CUDA graphs stay valid). A first version of 2-8 columns on CUDA-core FMAs ran 1.4-2.6x
// slower than MMF (decode.py at 8 sequences 27.3 ms a step against 18.0).
// Several MUL_MATs of one x can run as one launch (pyqsa_cuda_gemv_group, for product-groups.cuh):
// the grid's row blocks span them all (one column: each row summed as it would be alone; 2-8: the
// launch's rows pick the form, so a row's sums may differ from its own launch's).
// PYQSA_CUDA_GEMV_UPSTREAM=1 leaves every call to upstream's kernels (read at every call, so that
// test-products checks and times both ways in one process).
// At 2-8 columns q4_K and q5_K take two 8-weight chunks a lane-step, q6_K four, 32 apart, from
// about one chunk's loads (gemv-weights.cuh, gemv_step_chunks); at one column q6_K four (where K
// gives every lane a step), the others one; PYQSA_CUDA_GEMV_ONE_CHUNK=1 gives them one chunk a
// lane-step, as every other type. PYQSA_CUDA_GEMV_FORM="W,RG" forces one form on
// every 2-8 column launch (W warps, 16 RG rows a CTA, no split). Both are read at every call (so
// that test-products checks and times each way in one process).
#pragma once

#include "ggml-cuda/common.cuh"

// the most activation columns (tokens) a call takes
constexpr int PYQSA_GEMV_MAX_COLS = 8;
// the most MUL_MATs one launch takes
constexpr int PYQSA_GEMV_MAX_PARTS = 8;

// PYQSA_CUDA_GEMV_UPSTREAM unset or "0" (pyqsa-cuda.cu reads it at every call)
bool pyqsa_cuda_gemv_on();

// PYQSA_CUDA_GEMV_ONE_CHUNK unset or "0"
bool pyqsa_cuda_gemv_steps();

// whether the gemv reads weights of this type (gemv-weights.cuh)
bool pyqsa_cuda_gemv_reads(ggml_type type);

// runs the MUL_MAT dst = w x and returns true, or returns false (nothing launched)
bool pyqsa_cuda_gemv(ggml_backend_cuda_context & ctx, const ggml_tensor * w, const ggml_tensor * x, ggml_tensor * dst);

// runs the MUL_MATs dsts[0..n) (n <= PYQSA_GEMV_MAX_PARTS, all of one src[1]) in one launch and
// returns true, or returns false (nothing launched): at one column, where their rows together are
// too few for two a warp, as pyqsa_cuda_gemv declines one such matrix
bool pyqsa_cuda_gemv_group(ggml_backend_cuda_context & ctx, const ggml_tensor * const * dsts, int n);

// runs the MUL_MAT_ID dst and returns true, or returns false (nothing launched)
bool pyqsa_cuda_gemv_id(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
