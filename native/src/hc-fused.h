// pyqsa: whether qwen4exp's graph builds its hyper-connection chains as pyqsa's fused ops
// (native/include/pyqsa-ggml.h), included by the patched model graph (ggml_patches/0016).
#pragma once

// The combine (scatter weights 2 * sigmoid(inject / hc), each stream plus the block's output
// scaled by its weight) as pyqsa_ggml_hc_combine, one op where upstream's graph has four, and
// the mix's gate silu(lo / hc) as pyqsa_ggml_silu_scaled, one op for two; both off when
// PYQSA_HC_UNFUSED is set to anything but "" or "0" (read once), to compare the ways.
bool pyqsa_hc_fused();
