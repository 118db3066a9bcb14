// CUDA kernel of PYQSA_GGML_OP_SAMPLE (see native/include/pyqsa-ggml.h).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_sample(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool pyqsa_cuda_sample_supported(const ggml_tensor * op);

// node i of cgraph is a sample op: it and the sample ops that follow it (views and no-ops
// between them skipped), independent of each other, in one launch; returns the nodes after i
// that launch covered, 0 when only node i could go (then nothing ran: it runs the usual way)
int pyqsa_cuda_sample_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);
