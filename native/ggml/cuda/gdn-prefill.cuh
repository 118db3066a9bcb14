// The gated delta rule of the linear-attention layers over a prefill batch (upstream's
// GGML_OP_GATED_DELTA_NET with a scalar gate, head size 128), read by the patched
// gated_delta_net.cu (ggml_patches/0012). Upstream's kernel gives a column of the state a warp
// and, every token, waits on two 5-step warp sums and on that token's global loads; this one
// gives a column 16 lanes (4-step sums, four partial sums a lane) and stages each tile of tokens'
// q, k, v, decay and beta in shared memory a tile ahead (cp.async), so a token's chain has no
// global load in it. Decode (fewer than PYQSA_GDN_PREFILL_MIN_TOKENS tokens a sequence), KDA
// gates, state snapshots (K > 1), other head sizes and unaligned rows stay on upstream's kernel.
// PYQSA_CUDA_GDN_UPSTREAM=1 keeps every call there (read at every call: test-gdn checks and times
// both ways); PYQSA_CUDA_GDN_LANES=32 puts a column on a whole warp (a 16-token tile), for
// test-gdn's timings.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// on the H200 (Flash-Next's layers, one sequence) upstream's kernel was faster at 32 tokens (31.0
// against 37.6 us) and this one from 64 (44.0 against 46.1; 913.6 against 1289.2 at 2048)
constexpr int64_t PYQSA_GDN_PREFILL_MIN_TOKENS = 64;

// upstream's launch arguments, strides in floats:
//   q, k [S_v, neqk1 heads, n_tokens, n_seqs / rq3]: (sq1, sq2, sq3); head h reads q head h % neqk1,
//        sequence s reads q sequence s / rq3
//   v    [S_v, H, n_tokens, n_seqs]: (sv1, sv2, sv3); g, beta [1, H, n_tokens, n_seqs]: (sb1, sb2, sb3)
//   s0   [S_v (row i), S_v (column j), H, n_seqs] contiguous; s1 the same layout
//   o    [S_v, H, n_tokens, n_seqs] contiguous
struct pyqsa_gdn_problem {
    const float *q, *k, *v, *g, *beta, *s0;
    float *      o, *s1;
    int64_t      S_v, H, n_tokens, n_seqs;
    int64_t      sq1, sq2, sq3, sv1, sv2, sv3, sb1, sb2, sb3;
    int64_t      neqk1, rq3;
    float        scale;
};

// PYQSA_CUDA_GDN_UPSTREAM unset or "0" (pyqsa-cuda.cu reads it at every call)
bool pyqsa_cuda_gdn_staged();

// PYQSA_CUDA_GDN_LANES: 32, or 16 (the default) for anything else
int pyqsa_cuda_gdn_lanes();

// runs the call and returns true, or returns false (nothing launched) for upstream's kernel to run it
bool pyqsa_cuda_gdn_prefill(const pyqsa_gdn_problem & p, cudaStream_t stream);
