"""Tiny random Qwen4-Exp checkpoints for tests (transformers + torch CPU, deterministic).

8 layers (3 and 7 are QSA), budget 16 tokens with ratio 4, so selection prunes from position
19 on; output gate and partial_rotary_factor are explicit (the two defaults upstream gets wrong).
The tokenizer is the real Qwen one, rebuilt as an HF tokenizer folder from the vocab GGUF in the
pinned upstream sdist, so vocab_size is 151936.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE_ROOT = ROOT / ".build" / "test-models"
# the Qwen3.5 Split regex (the vocab GGUF's pre-tokenizer "qwen35")
QWEN35_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def tiny_config(ple: bool):
    from transformers import Qwen4ExpTextConfig

    cfg = Qwen4ExpTextConfig(
        vocab_size=151936,
        hidden_size=64,
        num_hidden_layers=8,
        full_attention_interval=4,  # layers 3 and 7 are indexed attention
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        output_gate_type="sigmoid",
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,  # rotary dim 16 = 2 * (3 + 3 + 2)
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # nk != nv exercises the V-head reorder
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        norm_topk_prob=True,
        hc_count=2,
        hc_lowrank=8,
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=32,
        indexer_budget=16,
        indexer_compress_ratio=4,
        ple_layer_ids=[2] if ple else None,  # 1-based: layer 1, a linear one
        ngram_size=3,
        heads_per_ngram=2,
        ngram_vocab_size_base=1000,  # the default 20M makes a multi-GB table
        make_ngram_vocab_size_divisible_by=128,
        split_ngram_parts=2,
        ple_conv_kernel_size=4,
        seed=1234,
        bos_token_id=None,
        eos_token_id=151645,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    return cfg


def make_tiny_model(ple: bool, seed: int = 0):
    import torch
    from transformers import Qwen4ExpForCausalLM

    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(tiny_config(ple)).eval().float()
    # HF inits every zero-centred gamma and the PLE conv to 0: perturb them, so the converter's
    # +1 offsets and the conv squeeze are exercised
    g = torch.Generator().manual_seed(seed + 1)
    suffixes = ("norm.weight", "layernorm.weight", "norm_key.weight", "norm_query.weight")
    suffixes += ("norm_conv.weight", "ple.conv1d.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffixes):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def save_qwen_tokenizer(out: Path) -> None:
    """Rebuild an HF fast tokenizer from the Qwen vocab GGUF (tokens keep their GGUF ids).

    Class Qwen3_5Tokenizer, as AutoTokenizer uses for real qwen4_exp checkpoints: qwen35 split
    regex and NFC (tokenizer.json says the same, for tools that read it directly).
    """
    from pyqsa.convert import from_vocab_gguf, qwen_vocab_gguf
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    v = from_vocab_gguf(qwen_vocab_gguf())
    typed = list(enumerate(zip(v.tokens, v.token_types, strict=True)))
    vocab = {t: i for i, (t, ty) in typed if ty == 1}
    merges = [tuple(m.split(" ", 1)) for m in v.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    specials = [
        (i, t) for i, (t, ty) in enumerate(zip(v.tokens, v.token_types, strict=True)) if ty == 3
    ]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in specials])
    for i, t in specials:
        assert tok.token_to_id(t) == i, (t, i)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "chat_template": v.chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def make_tiny_checkpoint(out: str | Path, ple: bool, seed: int = 0) -> Path:
    """Save a tiny random Qwen4ExpForCausalLM (+ Qwen tokenizer) to the folder `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    make_tiny_model(ple, seed).save_pretrained(out)
    save_qwen_tokenizer(out)
    return out


def factory_hash() -> str:
    """Changes whenever this factory or the libraries that build the model change."""
    import torch
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"{torch.__version__} {transformers.__version__}".encode())
    return h.hexdigest()[:16]


def cached_checkpoint(name: str, ple: bool, fallback_root: Path, seed: int = 0) -> Path:
    """The checkpoint under .build/test-models/<hash>/<name>, built once (atomically).

    Falls back to `fallback_root` when .build is not writable.
    """
    for root in (CACHE_ROOT / factory_hash(), fallback_root):
        final = root / name
        if (final / "config.json").exists() and (final / "tokenizer.json").exists():
            return final
        tmp = root / f".{name}.tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            make_tiny_checkpoint(tmp, ple, seed)
            tmp.rename(final)
            return final
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if (final / "config.json").exists():  # another run won the race
                return final
    raise RuntimeError(f"could not build the tiny checkpoint {name}")
