#pragma once

#include "ggml-cuda/common.cuh"
#include "pyqsa-ggml.h"

// a QSA_SCORE call as both CUDA kernels read it (qsa-score.cu, qsa-score-mma.cu)
struct qsa_score_args {
    const char * q;     // [D, n_head, n_tps, ns]
    const char * keys;  // [D, n_blocks, ns]
    float *      dst;   // contiguous [n_blocks, n_tps, ns]
    size_t q_nb1, q_nb2, q_nb3;
    size_t k_nb1, k_nb2;
    int    n_head, n_tps, n_blocks;
    float  scale;
};

inline qsa_score_args qsa_score_args_of(const ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * keys = dst->src[1];
    qsa_score_args a;
    a.q        = (const char *) q->data;
    a.keys     = (const char *) keys->data;
    a.dst      = (float *) dst->data;
    a.q_nb1    = q->nb[1];
    a.q_nb2    = q->nb[2];
    a.q_nb3    = q->nb[3];
    a.k_nb1    = keys->nb[1];
    a.k_nb2    = keys->nb[2];
    a.n_head   = (int) q->ne[1];
    a.n_tps    = (int) q->ne[2];
    a.n_blocks = (int) keys->ne[1];
    a.scale    = ggml_get_op_params_f32(dst, 1);
    return a;
}

// QSA_SCORE's result (the call `a` of dst) on tensor cores when the call suits them (at least
// PYQSA_GGML_QSA_SCORE_CUDA_MMA_MIN_TPS queries per stream, D = 32, 64, 128 or 256, n_head = 1, 2,
// 4 or 8 (8 up to D = 128), 16-byte aligned rows, sm_80 or later); false, having done nothing,
// otherwise
bool pyqsa_cuda_qsa_score_mma(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, const qsa_score_args & a);
