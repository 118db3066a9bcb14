// How the CUDA backend runs a MoE product (MUL_MAT_ID) with f16/bf16/f32 experts (read by the
// patched mmf.cu). Upstream's MMF kernel groups the tokens by expert on the device, but upstream
// takes it only up to 512 tokens (128 for expert matrices of more than 1024 rows); past that it
// copies the expert ids to the host, waits for the stream, sorts there and runs one cuBLAS product
// per expert: two stream syncs per MoE product, three products per layer, so a prefill batch
// drains the GPU some 150 times. pyqsa keeps every batch on MMF; PYQSA_CUDA_MOE_SYNC=1 restores
// upstream's choice (bench/gpu_run.sh's `moesync` variant measures the two side by side).
// Quantized experts are unaffected: MMQ groups them on the device at every batch.
#pragma once

// read at every call, so that one process can check and time each way (test-products)
bool pyqsa_cuda_moe_on_device();

// PYQSA_CUDA_MOE_MMF unset or "0": prefill batches of f16 experts on pyqsa's grouped GEMM
// (native/ggml/cuda/moe-gemm.cuh), not on MMF
bool pyqsa_cuda_moe_grouped();
