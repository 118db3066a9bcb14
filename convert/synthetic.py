"""Random HF-named weights for a Qwen4-Exp config, made with numpy alone (demos, benchmarks).

`random_tensors(config)` gives every tensor `write_model` expects, initialised the way HF
initialises them (normal(0, initializer_range) matrices, zero-centred RMSNorm gammas at 0, the
GDN gated-norm gamma at 1, A_log = log(U(1, 16)), dt_bias 1). PLE hash constants are computed
exactly as transformers' Qwen4ExpTextNGramEmbedding does, so a runtime hashes n-grams the same.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .checkpoint import ArraySource
from .hf_config import ModelConfig, parse_config
from .tensors import expected_shapes

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_ZERO_CENTRED = ("norm.weight", "layernorm.weight", "norm_key.weight", "norm_query.weight")
_ZERO_CENTRED += ("norm_conv.weight",)


def _splitmix64(x: int) -> int:
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & _MASK64


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def ple_hash_constants(config: dict[str, Any]) -> tuple[dict[str, list[int]], int]:
    """({layer_multipliers, ngram_heads_offsets, ngram_heads_vocab_sizes}, padded table rows)
    for the (single) PLE layer of an HF config."""
    cfg = parse_config(config)
    hp = {**config, **(config.get("text_config") or {})}
    base = hp.get("ngram_vocab_size_base", 20_000_000)
    divisor = hp.get("make_ngram_vocab_size_divisible_by", 128)
    seed = hp.get("seed", 1234)
    sizes, offsets, prime = [], [], base - 1
    for _ in range(cfg.ple_n_heads):  # the single PLE module is index 0: heads 0..n-1
        prime += 1
        while not _is_prime(prime):
            prime += 1
        offsets.append(sum(sizes))
        sizes.append(prime)
    half = max(1, ((1 << 63) - 1) // max(cfg.vocab_size, 1) // 2)
    mults = [
        2 * (_splitmix64((seed + _GAMMA * (i + 1)) & _MASK64) % half) + 1
        for i in range(cfg.ngram_size)
    ]
    rows = math.ceil(sum(sizes) / divisor) * divisor
    consts = {
        "layer_multipliers": mults,
        "ngram_heads_offsets": offsets,
        "ngram_heads_vocab_sizes": sizes,
    }
    return consts, rows


def hf_tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF checkpoint name -> shape for every tensor of the config (per-expert layout, and one
    unsharded `ngram_embedding.weight` for PLE)."""
    cfg = parse_config(config)
    placeholder = {}
    if cfg.ple_layer is not None:
        rows = ple_hash_constants(config)[1]
        name = f"model.layers.{cfg.ple_layer}.ple.ple_embedding.ngram_embedding.weight"
        placeholder[name] = np.lib.stride_tricks.as_strided(
            np.zeros(1, np.float32), (rows, cfg.ple_row_dim), (0, 0)
        )
    return expected_shapes(cfg, ArraySource(placeholder))


def random_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Every HF tensor of the config with HF-like random initial values."""
    cfg: ModelConfig = parse_config(config)
    hp = {**config, **(config.get("text_config") or {})}
    std = float(hp.get("initializer_range", 0.02))
    rng = np.random.default_rng(seed)
    consts = ple_hash_constants(config)[0] if cfg.ple_layer is not None else {}
    out = {}
    for name, shape in hf_tensor_shapes(config).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in consts:
            out[name] = np.array(consts[leaf], dtype=np.int64)
        elif name.endswith("linear_attn.norm.weight") or leaf == "dt_bias":
            out[name] = np.ones(shape, np.float32)
        elif leaf == "A_log":
            out[name] = np.log(rng.uniform(1, 16, shape)).astype(np.float32)
        elif name.endswith(_ZERO_CENTRED):
            out[name] = np.zeros(shape, np.float32)
        else:
            out[name] = rng.normal(0, std, shape).astype(np.float32)
    return out
