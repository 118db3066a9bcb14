// Matrix-product precision of the CUDA backend (read by the patched common.cuh, solve_tri.cu,
// mmf.cu, mmvf.cu and ggml-cuda.cu). Upstream runs every f32 product in TF32: cuBLAS handles are put in
// CUBLAS_TF32_TENSOR_OP_MATH and ggml's own f32 mma kernels use TF32 instructions, about 1e-3
// relative error per product. PYQSA_CUDA_STRICT_F32=1 keeps them f32 (cuBLAS default math, no
// f32 mma kernels): slower, for checks against an f32 reference (tests/gpu/parity.sh). The QSA
// block scores, whose near ties TF32 would resolve differently, are pyqsa's own op (QSA_SCORE)
// and f32-level whatever the setting.
#pragma once

#include <cublas_v2.h>

bool pyqsa_cuda_strict_f32();

// f16 products on cuBLAS (the dense weights of an f16 model, past MMF's 16 columns: every prefill
// batch) sum in f32 into an f32 result, as the reference (HF's f16 products) and the decode kernels
// do. Upstream, on NVIDIA GPUs from Turing on, sums them in f16 into an f16 result that a second
// kernel converts to f32: half-precision accumulation over the 2560-long rows of Flash-Next. Its
// MMVF (decode products of 1-8 columns) likewise keeps each thread's partial sums in half2 where
// the GPU has fast f16 (the ungrouped one-column products: ssm_out over 4096, wo over 6144);
// those sum in f32 too (patch 0027). PYQSA_CUDA_F16_ACCUMULATE=1 restores upstream's choices (read
// at every call, so that one process can check both ways: test-products).
bool pyqsa_cuda_f16_products_f32();

// the math mode cuBLAS handles go back to after any op that changes it
inline cublasMath_t pyqsa_cuda_f32_math() {
    return pyqsa_cuda_strict_f32() ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH;
}
