"""A tiny random Qwen4-Exp whose every row length is a multiple of 256 (k-quants' block), so
Q4_K / Q5_K / Q6_K / IQ4_XS really apply instead of falling back to 32-element types.

The structure of tests/models.py's tiny model (8 layers, 3 and 7 QSA, budget 16, ratio 4, PLE
on layer 1, the Qwen tokenizer), hidden 256 and head/expert widths to match.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from models import CACHE_ROOT, factory_hash, save_qwen_tokenizer, tiny_config

WIDE = {
    "hidden_size": 256,
    "head_dim": 64,  # 4 heads x 64: o_proj rows of 256
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,  # 4 value heads x 64: ssm_out rows of 256
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
    "indexer_head_dim": 64,
    "ple_embed_dim": 256,  # must equal hidden_size
}
# rotary dim 32 = head_dim 64 x 0.5 = 2 * (6 + 5 + 5)
MROPE_SECTION = [6, 5, 5]


def wide_config():
    cfg = tiny_config(ple=True)
    for k, v in WIDE.items():
        setattr(cfg, k, v)
    cfg.rope_parameters = {**cfg.rope_parameters, "mrope_section": MROPE_SECTION}
    return cfg


def _make(out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen4ExpForCausalLM

    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(wide_config()).eval().float()
    g = torch.Generator().manual_seed(seed + 1)
    # HF inits zero-centred gammas to 0: perturb them as tests/models.py does
    suffixes = ("norm.weight", "layernorm.weight", "norm_key.weight", "norm_query.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffixes + ("norm_conv.weight", "ple.conv1d.weight")):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    save_qwen_tokenizer(out)


def wide_checkpoint(fallback_root: Path, seed: int = 0) -> Path:
    """The checkpoint, built once under .build/test-models (atomically), else fallback_root."""
    h = hashlib.sha256(Path(__file__).read_bytes() + factory_hash().encode()).hexdigest()[:16]
    for root in (CACHE_ROOT / f"wide-{h}", fallback_root):
        final = root / "wide"
        if (final / "tokenizer.json").exists():
            return final
        tmp = root / f".wide.{seed}.tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            _make(tmp, seed)
            tmp.rename(final)
            return final
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if (final / "tokenizer.json").exists():
                return final
    raise RuntimeError("could not build the wide checkpoint")
