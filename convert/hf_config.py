"""Read, validate and normalise an HF Qwen4-Exp config.json into a frozen dataclass.

Normalisation follows transformers' own defaults (configuration_qwen4_exp.py, 5.23): missing
`layer_types` come from `full_attention_interval` (default 4), `full_attention` (what the
checkpoint writes) and `qwen_sparse_attention` (what other transformers releases rename it to on
load, so every checkpoint saved through one carries it) mean `indexed_attention`,
`partial_rotary_factor` defaults to 1.0, and the GDN output gate is
`output_gate_type or hidden_act`. Everything the pinned upstream graph hard-codes (silu
activations, normalised top-k routing, no attention bias, equal GDN head dims) is checked too,
so a file that would silently compute something else is refused instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConvertError

ARCHITECTURES = ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration")
MODEL_TYPES = ("qwen4_exp", "qwen4_exp_text")
QSA_FIELDS = (
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
)
LINEAR, INDEXED = "linear_attention", "indexed_attention"
# the other names of a QSA layer in `layer_types` (see the top of the file)
INDEXED_ALIASES = ("full_attention", "qwen_sparse_attention")


def is_indexed(layer_type: str) -> bool:
    """Whether a `layer_types` entry names a QSA layer, by any of its names."""
    return layer_type == INDEXED or layer_type in INDEXED_ALIASES


# Qwen4ExpTextConfig class defaults for the fields the conversion reads
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 248320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 10,
    "num_experts": 512,
    "hc_count": 4,
    "hc_lowrank": 320,
    "ple_conv_kernel_size": 4,
    "ngram_size": 3,
    "heads_per_ngram": 8,
    "split_ngram_parts": 512,
    "norm_topk_prob": True,
}


@dataclass(frozen=True)
class ModelConfig:
    """The normalised text-model config; field names follow GGUF meaning, not HF spelling."""

    architecture: str
    vocab_size: int
    hidden_size: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    context_length: int
    rope_theta: float
    rope_dim: int
    rope_sections: tuple[int, int, int, int]
    layer_types: tuple[str, ...]
    output_gate: str
    ssm_conv_kernel: int
    ssm_head_dim: int  # linear key head dim == value head dim
    ssm_n_k_heads: int
    ssm_n_v_heads: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    shexp_ff: int
    hc_count: int
    hc_lowrank: int
    indexer_n_heads: int
    indexer_head_dim: int
    indexer_budget: int
    compress_ratio: int
    tie_word_embeddings: bool
    ple_layer: int | None  # 0-based
    ple_embed_dim: int
    ngram_size: int
    heads_per_ngram: int
    ple_conv_kernel: int
    split_ngram_parts: int
    eos_token_id: int | None  # HF's PLE eos: the first one when a list
    image_token_id: int | None

    @property
    def qsa_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == INDEXED]

    @property
    def recurrent_layers(self) -> list[bool]:
        return [t == LINEAR for t in self.layer_types]

    @property
    def compress_ratios(self) -> list[int]:
        return [self.compress_ratio if t == INDEXED else 0 for t in self.layer_types]

    @property
    def ple_n_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def ple_row_dim(self) -> int:
        return self.ple_embed_dim // self.ple_n_heads


def load_config(hf_dir: Path) -> dict[str, Any]:
    path = Path(hf_dir) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: not found (expected an HF checkpoint folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: unreadable config ({e})") from None


def _int(hp: dict[str, Any], key: str) -> int:
    v = hp.get(key, _DEFAULTS.get(key))
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConvertError(f"config: {key} must be an integer, got {v!r}")
    return v


def _positive(hp: dict[str, Any], key: str) -> int:
    v = _int(hp, key)
    if v <= 0:
        raise ConvertError(f"config: {key} must be > 0, got {v}")
    return v


def _text_fields(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Pick the architecture and merge the text sub-config over the root (as HF nests it)."""
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        got = ", ".join(archs) if archs else f"model_type {raw.get('model_type')!r}"
        if archs or raw.get("model_type") not in MODEL_TYPES:
            raise ConvertError(
                f"unsupported architecture {got}: pyqsa converts {' and '.join(ARCHITECTURES)}"
            )
        arch = ARCHITECTURES[0] if raw["model_type"] == "qwen4_exp_text" else ARCHITECTURES[1]
    text = raw.get("text_config")
    if arch == ARCHITECTURES[1] and isinstance(text, dict):
        return arch, {**raw, **text}
    return arch, dict(raw)


def _layer_types(hp: dict[str, Any], n_layer: int) -> tuple[str, ...]:
    types = hp.get("layer_types")
    if types is None:
        interval = hp.get("full_attention_interval", 4)
        if not isinstance(interval, int) or interval <= 0:
            raise ConvertError(f"config: full_attention_interval must be > 0, got {interval!r}")
        return tuple(LINEAR if (i + 1) % interval else INDEXED for i in range(n_layer))
    types = tuple(INDEXED if is_indexed(t) else t for t in types)
    if len(types) != n_layer:
        raise ConvertError(
            f"config: layer_types has {len(types)} entries, num_hidden_layers is {n_layer}"
        )
    bad = sorted(set(types) - {LINEAR, INDEXED})
    if bad:
        raise ConvertError(f"config: unsupported layer types {bad}")
    return types


def _rope(hp: dict[str, Any], head_dim: int) -> tuple[float, int, tuple[int, int, int, int]]:
    rp = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key not in rp and key in hp:
            rp[key] = hp[key]  # older configs keep these at the top level
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type != "default":
        raise ConvertError(f"config: rope_type {rope_type!r} is not supported (only 'default')")
    factor = float(rp.get("partial_rotary_factor", 1.0))
    sections = list(rp.get("mrope_section", [11, 11, 10]))
    if len(sections) > 4:
        raise ConvertError(f"config: mrope_section has {len(sections)} entries, at most 4")
    sections += [0] * (4 - len(sections))
    return float(rp.get("rope_theta", 10000.0)), int(head_dim * factor), tuple(sections)


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Validate an HF config dict (flat or with text_config) and normalise it."""
    arch, hp = _text_fields(raw)
    n_layer = _positive(hp, "num_hidden_layers")
    hidden = _positive(hp, "hidden_size")
    head_dim = _positive(hp, "head_dim")
    layer_types = _layer_types(hp, n_layer)
    rope_theta, rope_dim, sections = _rope(hp, head_dim)

    act = hp.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config: hidden_act {act!r} is not supported (the graph uses silu)")
    gate = hp.get("output_gate_type") or act
    if gate not in ("sigmoid", "silu"):
        raise ConvertError(f"config: output gate {gate!r} is not supported (sigmoid or silu)")
    if hp.get("attention_bias", False):
        raise ConvertError("config: attention_bias=true is not supported (the graph has no bias)")
    if not hp.get("norm_topk_prob", True):
        raise ConvertError("config: norm_topk_prob=false is not supported (the graph normalises)")

    hc = _int(hp, "hc_count")
    if hc <= 1:
        raise ConvertError(f"config: hc_count must be > 1, got {hc}")
    dk, dv = _positive(hp, "linear_key_head_dim"), _positive(hp, "linear_value_head_dim")
    if dk != dv:
        raise ConvertError(f"config: linear_key_head_dim {dk} != linear_value_head_dim {dv}")
    nk, nv = _positive(hp, "linear_num_key_heads"), _positive(hp, "linear_num_value_heads")
    if nv % nk:
        raise ConvertError(f"config: linear_num_value_heads {nv} is not a multiple of {nk}")
    n_expert, n_used = _positive(hp, "num_experts"), _positive(hp, "num_experts_per_tok")
    if n_used > n_expert:
        raise ConvertError(f"config: num_experts_per_tok {n_used} > num_experts {n_expert}")

    missing = [f for f in QSA_FIELDS if hp.get(f) is None]
    if missing:
        raise ConvertError(f"config: missing QSA fields {', '.join(missing)}")
    qsa = {f: _positive(hp, f) for f in QSA_FIELDS}
    if qsa["indexer_kv_heads"] != 1:
        raise ConvertError(f"config: indexer_kv_heads must be 1, got {qsa['indexer_kv_heads']}")
    if qsa["indexer_budget"] % qsa["indexer_compress_ratio"]:
        raise ConvertError(
            f"config: indexer_budget {qsa['indexer_budget']} is not divisible by "
            f"indexer_compress_ratio {qsa['indexer_compress_ratio']}"
        )
    if rope_dim > qsa["indexer_head_dim"]:
        raise ConvertError(
            f"config: rotary dim {rope_dim} exceeds indexer_head_dim {qsa['indexer_head_dim']}"
        )

    eos = hp.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    eos = eos if isinstance(eos, int) else None
    ple_ids = sorted(set(hp.get("ple_layer_ids") or []))
    ple_embed_dim = hp.get("ple_embed_dim") or hidden
    ple_layer = None
    if ple_ids:
        ple_layer = _check_ple(hp, ple_ids, layer_types, hidden, ple_embed_dim, eos)

    return ModelConfig(
        architecture=arch,
        vocab_size=_positive(hp, "vocab_size"),
        hidden_size=hidden,
        n_layer=n_layer,
        n_head=_positive(hp, "num_attention_heads"),
        n_head_kv=_positive(hp, "num_key_value_heads"),
        head_dim=head_dim,
        rms_eps=float(hp.get("rms_norm_eps", _DEFAULTS["rms_norm_eps"])),
        context_length=_positive(hp, "max_position_embeddings"),
        rope_theta=rope_theta,
        rope_dim=rope_dim,
        rope_sections=sections,
        layer_types=layer_types,
        output_gate=gate,
        ssm_conv_kernel=_positive(hp, "linear_conv_kernel_dim"),
        ssm_head_dim=dk,
        ssm_n_k_heads=nk,
        ssm_n_v_heads=nv,
        n_expert=n_expert,
        n_expert_used=n_used,
        expert_ff=_positive(hp, "moe_intermediate_size"),
        shexp_ff=_positive(hp, "shared_expert_intermediate_size"),
        hc_count=hc,
        hc_lowrank=_positive(hp, "hc_lowrank"),
        indexer_n_heads=qsa["indexer_n_heads"],
        indexer_head_dim=qsa["indexer_head_dim"],
        indexer_budget=qsa["indexer_budget"],
        compress_ratio=qsa["indexer_compress_ratio"],
        tie_word_embeddings=bool(hp.get("tie_word_embeddings", False)),
        ple_layer=ple_layer,
        ple_embed_dim=ple_embed_dim,
        ngram_size=_int(hp, "ngram_size"),
        heads_per_ngram=_int(hp, "heads_per_ngram"),
        ple_conv_kernel=_int(hp, "ple_conv_kernel_size"),
        split_ngram_parts=_int(hp, "split_ngram_parts"),
        eos_token_id=eos,
        image_token_id=raw.get("image_token_id") if arch == ARCHITECTURES[1] else None,
    )


def _check_ple(
    hp: dict[str, Any],
    ple_ids: list[int],
    layer_types: tuple[str, ...],
    hidden: int,
    embed_dim: int,
    eos: int | None,
) -> int:
    # upstream holds one set of hash constants and needs ple_embed_dim == hidden_size
    if len(ple_ids) != 1:
        raise ConvertError(f"config: ple_layer_ids {ple_ids}: only one PLE layer is supported")
    layer = ple_ids[0] - 1  # HF is 1-based
    if not 0 <= layer < len(layer_types) or layer_types[layer] != LINEAR:
        raise ConvertError(f"config: PLE layer id {ple_ids[0]} is not a linear_attention layer")
    if embed_dim != hidden:
        raise ConvertError(f"config: ple_embed_dim {embed_dim} must equal hidden_size {hidden}")
    heads = (_int(hp, "ngram_size") - 1) * _int(hp, "heads_per_ngram")
    if not 2 <= _int(hp, "ngram_size") <= 8 or heads <= 0 or heads > 64 or embed_dim % heads:
        raise ConvertError(
            f"config: PLE n-gram heads {heads} must be in 1..64 and divide ple_embed_dim "
            f"{embed_dim} (ngram_size in 2..8)"
        )
    if eos is None:
        raise ConvertError("config: eos_token_id is required with PLE (the n-gram hash uses it)")
    _positive(hp, "ple_conv_kernel_size")
    _positive(hp, "split_ngram_parts")
    return layer


def ple_rows_needed(offsets: list[int], sizes: list[int]) -> int:
    """Rows the n-gram table must have for the hashed head ranges."""
    return max((o + s for o, s in zip(offsets, sizes, strict=True)), default=0)
