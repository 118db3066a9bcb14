// pyqsa: whether qwen4exp's graph builds its chains as pyqsa's fused ops
// (native/include/pyqsa-ggml.h), included by the patched model graph (ggml_patches/0016, 0021).
// Each switch is read once; a variable set to anything but "" or "0" keeps upstream's ops, to
// compare the ways.
#pragma once

#include <cstdint>

// The hyper-connection combine (scatter weights 2 * sigmoid(inject / hc), each stream plus the
// block's output scaled by its weight) as pyqsa_ggml_hc_combine, one op where upstream's graph
// has four, and the mix's gate silu(lo / hc) as pyqsa_ggml_silu_scaled, one op for two; off with
// PYQSA_HC_UNFUSED.
bool pyqsa_hc_fused();

struct ggml_context;
struct ggml_tensor;

// That combine for a block's output: pyqsa_ggml_hc_combine, or where the output is a
// pyqsa_ggml_add_gated (the MoE's shared expert joining the routed ones)
// pyqsa_ggml_hc_combine_gated of the join's inputs, one op for the two (one launch fewer a layer,
// the same bits); PYQSA_HC_JOIN_UNFUSED keeps the join an op of its own.
ggml_tensor * pyqsa_hc_combine(ggml_context * ctx, ggml_tensor * block_out, ggml_tensor * residual,
                               ggml_tensor * inject, float scale);

// Whether a mix of hyper-connections (its grouped norm, the products down, up and inject, the
// gate and the streams' mean: five launches) runs as pyqsa_ggml_hc_down and pyqsa_ggml_hc_pre
// (two): for a layer whose weights live on a GPU whose backend runs both ops for them (asked:
// CUDA takes up to PYQSA_HC_MIX_MAX_TOKENS tokens on sm_90), at a one-sequence decode step (at 8
// they ran at par with upstream's ops), the tensors contiguous and the weights F16 or F32 (a
// quantized model's stay with upstream's products).
// Its products sum other inputs in another order than upstream's do, so unlike the switches
// above it agrees with upstream's ops to rounding, not bit for bit; so a CPU layer keeps
// upstream's ops, whose products round a row the same whatever the batch (a one-token chunk
// would round otherwise than inside a wider one: the prefix cache's follow-ups are exact on the
// CPU), and launches are a GPU's cost. Off with PYQSA_HC_MIX_UNFUSED; PYQSA_HC_MIX_TOKENS=N fuses
// steps of up to N tokens; PYQSA_HC_MIX_ANY_BACKEND=1 fuses on every backend (the CPU's tests of
// the graph).
bool pyqsa_hc_mix_fused(ggml_tensor * x, ggml_tensor * w_norm, ggml_tensor * w_down, ggml_tensor * w_up,
                        ggml_tensor * w_inject);

// The linear attention's decay and write-strength gates as pyqsa_ggml_gdn_gates (one op for
// upstream's add, softplus, mul and sigmoid), its q and k normalized as one view of their
// adjacent heads (one rms_norm and scale for two), a decode step's convolution with its SiLU and
// its state's store as pyqsa_ggml_conv_step (one op for concat, ssm_conv, silu and the copy; a
// prefill's state stored by one copy of the strided tail, no cont first), its output's gated
// norm as pyqsa_ggml_rms_norm_gated (one op for rms_norm, mul, sigmoid and mul, when the gate is a
// sigmoid), and the shared expert's sigmoid-gated join with the routed experts as
// pyqsa_ggml_add_gated (one op for sigmoid, mul and add); off with PYQSA_GATES_UNFUSED.
bool pyqsa_gates_fused();

class llama_memory_recurrent_context;

// Whether a ubatch of n_seqs sequences finds each one's recurrent state in the cell it writes
// (llama.cpp's s_copy the identity over the ubatch's cells, no cell to zero, no state to carry):
// then a decode step reads its convolution and delta-rule states in place, not through
// build_rs's gathered copies (two launches fewer a linear-attention layer, and at 8 sequences
// 32 MiB a layer less to move), safe because each kernel reads a state element before it
// writes it and no other kernel touches it (conv_step a thread a channel and sequence, the
// delta rule a warp a column). Never with rollback slots (n_rs_seq > 0). Off with
// PYQSA_GATES_UNFUSED.
bool pyqsa_rs_in_place(const llama_memory_recurrent_context * mctx, uint32_t n_seqs, uint32_t n_rs_seq);
