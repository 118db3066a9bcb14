"""GGUF key and tensor names for arch `qwen4exp` (as the pinned upstream loader reads them),
plus pyqsa's own `pyqsa.*` keys.

PyPI's gguf constants do not know qwen4exp, so the strings live here. Key strings follow
upstream src/llama-arch.cpp; `{}` is filled with the layer index.
"""

# pyqsa's own keys live with the runtime, which reads them too
from pyqsa.gguf_keys import (  # noqa: F401 (re-exported: the converter's one name table)
    PYQSA_CONVERTER_VERSION,
    PYQSA_KEYS,
    PYQSA_KV_SCALES_K,
    PYQSA_KV_SCALES_SOURCE,
    PYQSA_KV_SCALES_V,
    PYQSA_QSA_BUDGET,
    PYQSA_QSA_COMPRESS_RATIO,
    PYQSA_QSA_LAYERS,
    PYQSA_TOKENIZER_NORMALIZER,
)

ARCH = "qwen4exp"
CONVERTER_VERSION = "1"


def k(suffix: str) -> str:
    """An arch key: `qwen4exp.<suffix>`."""
    return f"{ARCH}.{suffix}"


# generic llama keys
CONTEXT_LENGTH = k("context_length")
EMBEDDING_LENGTH = k("embedding_length")
BLOCK_COUNT = k("block_count")
EXPERT_COUNT = k("expert_count")
EXPERT_USED_COUNT = k("expert_used_count")
HEAD_COUNT = k("attention.head_count")
HEAD_COUNT_KV = k("attention.head_count_kv")
KEY_LENGTH = k("attention.key_length")
VALUE_LENGTH = k("attention.value_length")
RMS_EPS = k("attention.layer_norm_rms_epsilon")
ROPE_FREQ_BASE = k("rope.freq_base")
ROPE_DIMENSION_COUNT = k("rope.dimension_count")
ROPE_DIMENSION_SECTIONS = k("rope.dimension_sections")
# qwen4exp keys
EXPERT_FFN_LENGTH = k("expert_feed_forward_length")
EXPERT_SHARED_FFN_LENGTH = k("expert_shared_feed_forward_length")
SSM_CONV_KERNEL = k("ssm.conv_kernel")
SSM_STATE_SIZE = k("ssm.state_size")
SSM_GROUP_COUNT = k("ssm.group_count")
SSM_TIME_STEP_RANK = k("ssm.time_step_rank")
SSM_INNER_SIZE = k("ssm.inner_size")
SSM_OUTPUT_GATE = k("ssm.output_gate")  # read by pyqsa's patched graph: "sigmoid" | "silu"
HC_COUNT = k("hyper_connection.count")
HC_LOW_RANK = k("hyper_connection.low_rank")
INDEXER_HEAD_COUNT = k("attention.indexer.head_count")
INDEXER_KEY_LENGTH = k("attention.indexer.key_length")
INDEXER_TOP_K = k("attention.indexer.top_k")
COMPRESS_RATIOS = k("attention.compress_ratios")
RECURRENT_LAYERS = k("attention.recurrent_layers")
FULL_ATTENTION_INTERVAL = k("full_attention_interval")
PLE_LAYERS = k("ple.layers")
PLE_NGRAM_SIZE = k("ple.ngram_size")
PLE_HEADS_PER_NGRAM = k("ple.heads_per_ngram")
PLE_CONV_KERNEL = k("ple.conv_kernel")
PLE_EOS_TOKEN_ID = k("ple.eos_token_id")
PLE_IMAGE_TOKEN_ID = k("ple.image_token_id")
PLE_EMBEDDING_LENGTH = k("embedding_length_per_layer_input")
PLE_LAYER_MULTIPLIERS = k("ple.layer_multipliers")
PLE_HEAD_OFFSETS = k("ple.head_offsets")
PLE_HEAD_VOCAB_SIZES = k("ple.head_vocab_sizes")

# tensor names (upstream llama-arch.cpp); BLK ones take the layer index
TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"
OUTPUT_HC_NORM = "output_hc_norm.weight"
OUTPUT_HC_DOWN = "output_hc_down.weight"
OUTPUT_HC_UP = "output_hc_up.weight"
PER_LAYER_TOKEN_EMBD = "per_layer_token_embd.weight"
BLK = "blk.{}."
HC = {  # (gguf prefix, HF module) for the two hyper-connections of every layer
    "hc_attn": "attn_hyper_connection",
    "hc_ffn": "mlp_hyper_connection",
}
