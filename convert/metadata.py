"""The qwen4exp GGUF metadata (keys upstream's loader reads) from a normalised config."""

from __future__ import annotations

from gguf import GGUFValueType as T

from . import names as N
from .hf_config import ModelConfig
from .tensors import PleConstants
from .writer import FILE_TYPES, KV


def model_kv(cfg: ModelConfig, ple: PleConstants | None, outtype: str, name: str) -> list[KV]:
    u32 = T.UINT32
    kv: list[KV] = [
        ("general.type", "model", T.STRING, None),
        ("general.name", name, T.STRING, None),
        ("general.file_type", int(FILE_TYPES[outtype]), u32, None),
        ("general.quantization_version", 2, u32, None),
        (N.CONTEXT_LENGTH, cfg.context_length, u32, None),
        (N.EMBEDDING_LENGTH, cfg.hidden_size, u32, None),
        (N.BLOCK_COUNT, cfg.n_layer, u32, None),
        (N.HEAD_COUNT, cfg.n_head, u32, None),
        (N.HEAD_COUNT_KV, cfg.n_head_kv, u32, None),
        (N.KEY_LENGTH, cfg.head_dim, u32, None),
        (N.VALUE_LENGTH, cfg.head_dim, u32, None),
        (N.RMS_EPS, cfg.rms_eps, T.FLOAT32, None),
        (N.ROPE_FREQ_BASE, cfg.rope_theta, T.FLOAT32, None),
        # HF rotates int(head_dim * partial_rotary_factor) dims (factor default 1.0)
        (N.ROPE_DIMENSION_COUNT, cfg.rope_dim, u32, None),
        (N.ROPE_DIMENSION_SECTIONS, list(cfg.rope_sections), T.ARRAY, T.INT32),
        (N.EXPERT_COUNT, cfg.n_expert, u32, None),
        (N.EXPERT_USED_COUNT, cfg.n_expert_used, u32, None),
        (N.EXPERT_FFN_LENGTH, cfg.expert_ff, u32, None),
        (N.EXPERT_SHARED_FFN_LENGTH, cfg.shexp_ff, u32, None),
        (N.SSM_CONV_KERNEL, cfg.ssm_conv_kernel, u32, None),
        (N.SSM_STATE_SIZE, cfg.ssm_head_dim, u32, None),
        (N.SSM_GROUP_COUNT, cfg.ssm_n_k_heads, u32, None),
        (N.SSM_TIME_STEP_RANK, cfg.ssm_n_v_heads, u32, None),
        (N.SSM_INNER_SIZE, cfg.ssm_head_dim * cfg.ssm_n_v_heads, u32, None),
        (N.SSM_OUTPUT_GATE, cfg.output_gate, T.STRING, None),
        (N.HC_COUNT, cfg.hc_count, u32, None),
        (N.HC_LOW_RANK, cfg.hc_lowrank, u32, None),
        (N.INDEXER_HEAD_COUNT, cfg.indexer_n_heads, u32, None),
        (N.INDEXER_KEY_LENGTH, cfg.indexer_head_dim, u32, None),
        (N.INDEXER_TOP_K, cfg.indexer_budget, u32, None),
        # the ratio on every indexed layer: 0 there would silently turn QSA into dense attention
        (N.COMPRESS_RATIOS, cfg.compress_ratios, T.ARRAY, u32),
        (N.RECURRENT_LAYERS, cfg.recurrent_layers, T.ARRAY, T.BOOL),
    ]
    if ple is not None:
        assert cfg.ple_layer is not None and cfg.eos_token_id is not None
        kv += [
            (N.PLE_LAYERS, [cfg.ple_layer], T.ARRAY, u32),
            (N.PLE_NGRAM_SIZE, cfg.ngram_size, u32, None),
            (N.PLE_HEADS_PER_NGRAM, cfg.heads_per_ngram, u32, None),
            (N.PLE_CONV_KERNEL, cfg.ple_conv_kernel, u32, None),
            # HF hashes with eos[0] (upstream's converter writes eos[-1])
            (N.PLE_EOS_TOKEN_ID, cfg.eos_token_id, u32, None),
            (N.PLE_EMBEDDING_LENGTH, ple.row_dim, u32, None),
            (N.PLE_LAYER_MULTIPLIERS, ple.layer_multipliers, T.ARRAY, T.UINT64),
            (N.PLE_HEAD_OFFSETS, ple.head_offsets, T.ARRAY, T.UINT64),
            (N.PLE_HEAD_VOCAB_SIZES, ple.head_vocab_sizes, T.ARRAY, T.UINT64),
        ]
        if cfg.image_token_id is not None:
            kv.append((N.PLE_IMAGE_TOKEN_ID, cfg.image_token_id, u32, None))
    return kv
