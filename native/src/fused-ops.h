// pyqsa: whether qwen4exp's graph builds its chains as pyqsa's fused ops
// (native/include/pyqsa-ggml.h), included by the patched model graph (ggml_patches/0016, 0021).
// Each switch is read once; a variable set to anything but "" or "0" keeps upstream's ops, to
// compare the ways.
#pragma once

// The hyper-connection combine (scatter weights 2 * sigmoid(inject / hc), each stream plus the
// block's output scaled by its weight) as pyqsa_ggml_hc_combine, one op where upstream's graph
// has four, and the mix's gate silu(lo / hc) as pyqsa_ggml_silu_scaled, one op for two; off with
// PYQSA_HC_UNFUSED.
bool pyqsa_hc_fused();

// The linear attention's decay and write-strength gates as pyqsa_ggml_gdn_gates (one op for
// upstream's add, softplus, mul and sigmoid), its q and k normalized as one view of their
// adjacent heads (one rms_norm and scale for two), a decode step's convolution with its SiLU and
// its state's store as pyqsa_ggml_conv_step (one op for concat, ssm_conv, silu and the copy; a
// prefill's state stored by one copy of the strided tail, no cont first), its output's gated
// norm as pyqsa_ggml_rms_norm_gated (one op for rms_norm, mul, sigmoid and mul, when the gate is a
// sigmoid), and the shared expert's sigmoid-gated join with the routed experts as
// pyqsa_ggml_add_gated (one op for sigmoid, mul and add); off with PYQSA_GATES_UNFUSED.
bool pyqsa_gates_fused();
