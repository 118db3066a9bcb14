"""The embedded default model: a small random Qwen4-Exp with the real Qwen tokenizer.

`pyqsa serve` / `pyqsa chat` without a model use it, so they work on any CPU machine out of
the box. Weights are deterministic numpy random draws (the text is gibberish, by design);
the tokenizer is the Qwen vocabulary shipped in the pinned upstream sdist, with Qwen's own
added tokens (<tool_call> ...) at their real ids. Written once by the converter's
`write_model` to `$PYQSA_CACHE_DIR` (default ~/.cache/pyqsa) under a name that changes with
this recipe, atomically, so concurrent first runs cannot see a partial file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SEED = 20261130
CONFIG: dict = {
    "architectures": ["Qwen4ExpForCausalLM"],
    "model_type": "qwen4_exp_text",
    "vocab_size": 151936,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3
    + ["indexed_attention"]
    + ["linear_attention"] * 3
    + ["indexed_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "output_gate_type": "sigmoid",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "norm_topk_prob": True,
    "hc_count": 2,
    "hc_lowrank": 8,
    "indexer_n_heads": 2,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 32,
    "indexer_budget": 16,
    "indexer_compress_ratio": 4,
    "ple_layer_ids": [],
    "bos_token_id": None,
    "eos_token_id": 151645,
    "pad_token_id": None,
    "tie_word_embeddings": False,
}

# Qwen2.5 / Qwen3 added tokens at their real ids; the vocab GGUF has placeholders there.
QWEN_ADDED = {
    151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>",
    151648: "<|box_start|>",
    151649: "<|box_end|>",
    151650: "<|quad_start|>",
    151651: "<|quad_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151657: "<tool_call>",
    151658: "</tool_call>",
    151659: "<|fim_prefix|>",
    151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>",
    151662: "<|fim_pad|>",
    151663: "<|repo_name|>",
    151664: "<|file_sep|>",
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
}
_CONTROL, _USER_DEFINED, _UNUSED = 3, 4, 5


def hf_tensors(cfg: dict, seed: int = SEED) -> Iterator[tuple[str, np.ndarray]]:
    """HF-named random weights for `cfg`, in a fixed order from one seeded generator."""
    rng = np.random.default_rng(seed)
    E, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hc, R = cfg["hc_count"], cfg["hc_lowrank"]
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    Hi, Di = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    hk, hv, Kc = (
        cfg["linear_key_head_dim"],
        cfg["linear_value_head_dim"],
        cfg["linear_conv_kernel_dim"],
    )
    X, F, Fs = (
        cfg["num_experts"],
        cfg["moe_intermediate_size"],
        cfg["shared_expert_intermediate_size"],
    )
    conv = 2 * nk * hk + nv * hv

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.02, shape).astype(np.float32)

    def gamma(n: int) -> np.ndarray:  # zero-centred RMSNorm weight: x * (1 + g)
        return rng.normal(0, 0.1, (n,)).astype(np.float32)

    def hyper(p: str) -> Iterator[tuple[str, np.ndarray]]:
        yield p + "hc_norm.weight", gamma(hc * E)
        yield p + "input_mix_weight_down.weight", w(R, hc * E)
        yield p + "input_mix_weight_up.weight", w(hc * E, R)

    yield "model.embed_tokens.weight", w(V, E)
    yield "lm_head.weight", w(V, E)
    yield from hyper("model.hyper_connection_mixer.")
    for il in range(L):
        p = f"model.layers.{il}."
        for part in ("attn_hyper_connection.", "mlp_hyper_connection."):
            yield from hyper(p + part)
            yield p + part + "block_inject_weight.weight", w(hc, hc * E)
        if cfg["layer_types"][il] == "indexed_attention":
            a = p + "self_attn."
            yield a + "q_proj.weight", w(2 * H * D, E)  # queries and the output gate
            yield a + "k_proj.weight", w(Hkv * D, E)
            yield a + "v_proj.weight", w(Hkv * D, E)
            yield a + "o_proj.weight", w(E, H * D)
            yield a + "q_norm.weight", gamma(D)
            yield a + "k_norm.weight", gamma(D)
            yield a + "indexer.index_qk_proj.weight", w((Hi + 1) * Di, E)
            yield a + "indexer.q_layernorm.weight", gamma(Di)
            yield a + "indexer.k_layernorm.weight", gamma(Di)
        else:
            a = p + "linear_attn."
            yield a + "A_log", np.log(rng.uniform(1, 16, (nv,))).astype(np.float32)
            yield a + "dt_bias", np.ones(nv, np.float32)
            yield a + "conv1d.weight", w(conv, 1, Kc)
            yield a + "in_proj_qkv.weight", w(conv, E)
            yield a + "in_proj_z.weight", w(nv * hv, E)
            yield a + "in_proj_a.weight", w(nv, E)
            yield a + "in_proj_b.weight", w(nv, E)
            yield a + "norm.weight", (1 + gamma(hv)).astype(np.float32)
            yield a + "out_proj.weight", w(E, nv * hv)
        m = p + "mlp."
        yield m + "gate.weight", w(X, E)
        for e in range(X):
            yield m + f"experts.{e}.gate_proj.weight", w(F, E)
            yield m + f"experts.{e}.up_proj.weight", w(F, E)
            yield m + f"experts.{e}.down_proj.weight", w(E, F)
        yield m + "shared_expert.gate_proj.weight", w(Fs, E)
        yield m + "shared_expert.up_proj.weight", w(Fs, E)
        yield m + "shared_expert.down_proj.weight", w(E, Fs)
        yield m + "shared_expert_gate.weight", w(1, E)


def qwen_tokenizer():
    """The sdist's Qwen vocab with Qwen's added tokens, <|im_end|> as EOS and a tools template."""
    from pyqsa.convert import from_vocab_gguf, qwen_vocab_gguf
    from pyqsa.server.qwen_template import QWEN_TEMPLATE

    tok = from_vocab_gguf(qwen_vocab_gguf())
    tokens, types = list(tok.tokens), list(tok.token_types)
    for i, text in QWEN_ADDED.items():
        tokens[i] = text
        types[i] = _CONTROL if text.startswith("<|") else _USER_DEFINED
    for i in range(max(QWEN_ADDED) + 1, len(tokens)):
        types[i] = _UNUSED  # "[PAD151700]" placeholders: never render them as text
    return dataclasses.replace(
        tok,
        tokens=tokens,
        token_types=types,
        special_ids={**tok.special_ids, "eos": 151645},
        chat_template=QWEN_TEMPLATE,
    )


def cache_dir() -> Path:
    env = os.environ.get("PYQSA_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pyqsa"


def recipe_hash() -> str:
    """Changes with this file (config, weights recipe, tokenizer edits) and the template."""
    from pyqsa.server.qwen_template import QWEN_TEMPLATE

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(json.dumps(CONFIG, sort_keys=True).encode() + QWEN_TEMPLATE.encode())
    return h.hexdigest()[:12]


def demo_model_path(cache: Path | None = None) -> Path:
    """The demo GGUF, built on first use (a few seconds) and cached in `cache` (default:
    cache_dir())."""
    from pyqsa.convert import write_model

    out = (cache or cache_dir()) / f"demo-{recipe_hash()}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # write_model writes a temp file and renames it over `out`: concurrent builders each
    # produce the same bytes and the last rename wins.
    # NOTE: f32, so batched and single-sequence runs round alike (f16 weights make batching
    # flip near-ties far more often).
    write_model(CONFIG, hf_tensors(CONFIG), qwen_tokenizer(), out, "f32", name="pyqsa-demo")
    return out
