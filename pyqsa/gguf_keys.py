"""pyqsa's own GGUF metadata keys (`pyqsa.*`), shared by the converter and the runtime.

kv_scales hold the absmax per KV head of what the indexed layers write into their KV cache
(K after k_norm and RoPE, V as projected), layer-major:
[qsa_layer0_head0, qsa_layer0_head1, ..., qsa_layer1_head0, ...]. A format whose largest
code is M stores x / (amax / M): M = 127 for int8, 448 for fp8 e4m3.
"""

PYQSA_CONVERTER_VERSION = "pyqsa.converter_version"
PYQSA_QSA_LAYERS = "pyqsa.qsa.layers"
PYQSA_QSA_COMPRESS_RATIO = "pyqsa.qsa.compress_ratio"
PYQSA_QSA_BUDGET = "pyqsa.qsa.budget"
PYQSA_KV_SCALES_K = "pyqsa.kv_scales.k"
PYQSA_KV_SCALES_V = "pyqsa.kv_scales.v"
PYQSA_KV_SCALES_SOURCE = "pyqsa.kv_scales.source"
# "NFC" when HF normalises text before BPE (llama.cpp does not); absent: no normalisation
PYQSA_TOKENIZER_NORMALIZER = "pyqsa.tokenizer.normalizer"
# the keys `pyqsa convert --refresh-qsa` rewrites
PYQSA_KEYS = (
    PYQSA_CONVERTER_VERSION,
    PYQSA_QSA_LAYERS,
    PYQSA_QSA_COMPRESS_RATIO,
    PYQSA_QSA_BUDGET,
    PYQSA_KV_SCALES_K,
    PYQSA_KV_SCALES_V,
    PYQSA_KV_SCALES_SOURCE,
)
