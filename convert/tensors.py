"""HF tensor -> GGUF tensor: names, shapes and transforms, checked before anything is written.

`plan_tensors` lists every HF tensor the config implies with its expected shape, refuses
missing, unexpected or mis-shaped tensors, and returns one `OutTensor` per GGUF tensor whose
`chunks()` loads and transforms its inputs only when the writer asks for it. Shapes are numpy
(torch) order; ggml's `ne` is the reverse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from . import names as N
from .checkpoint import TensorSource
from .errors import ConvertError
from .hf_config import INDEXED, ModelConfig, ple_rows_needed

# checkpoint parts that are not the text model (vision tower, MTP draft head)
_IGNORED = re.compile(r"^(model\.visual\.|visual\.|mtp\.|model\.mtp\.)")
# ConditionalGeneration nests the text model one level deeper
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."))
# 2-D tensors the graph reads as f32 (same set as upstream's converter, plus the PLE conv)
_F32_SUFFIXES = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_inp_shexp.weight",
    "ssm_conv1d.weight",
    "ple_conv1d.weight",
)


@dataclass(frozen=True)
class OutTensor:
    """One GGUF tensor: `chunks()` yields f32 row blocks (axis 0) that together form it."""

    name: str
    shape: tuple[int, ...]
    chunks: Callable[[], Iterator[np.ndarray]]

    @property
    def keep_f32(self) -> bool:
        return (
            len(self.shape) <= 1
            or self.name.endswith(_F32_SUFFIXES)
            or not self.name.endswith(".weight")  # ssm_a, ssm_dt.bias
        )

    def array(self) -> np.ndarray:
        return np.concatenate(list(self.chunks()), axis=0)


@dataclass(frozen=True)
class PleConstants:
    layer_multipliers: list[int]
    head_offsets: list[int]
    head_vocab_sizes: list[int]
    row_dim: int


@dataclass(frozen=True)
class Plan:
    tensors: list[OutTensor]
    ple: PleConstants | None


def reorder_v(a: np.ndarray, axis: int, nk: int, nv: int, hd: int) -> np.ndarray:
    """HF groups GDN value heads by key head; the graph wants them tiled (qwen.py:466-491)."""
    shape = list(a.shape)
    split = shape[:axis] + [nk, nv // nk, hd] + shape[axis + 1 :]
    return np.swapaxes(a.reshape(split), axis, axis + 1).reshape(shape)


class _Builder:
    def __init__(self, cfg: ModelConfig, src: TensorSource):
        self.cfg, self.src = cfg, src
        self.present: dict[str, str] = {}  # normalised HF name -> source name
        for name in src.names():
            if _IGNORED.match(name):
                continue
            norm = name
            for old, new in _PREFIXES:
                if norm.startswith(old):
                    norm = new + norm[len(old) :]
            self.present[norm] = name
        self.expected: dict[str, tuple[int, ...]] = {}
        self.out: list[OutTensor] = []

    def need(self, name: str, shape: tuple[int, ...]) -> str:
        self.expected[name] = shape
        return name

    def load(self, name: str) -> np.ndarray:
        return self.src.load(self.present[name])

    def emit(self, name: str, shape: tuple[int, ...], make: Callable[[], np.ndarray]) -> None:
        self.out.append(OutTensor(name, shape, lambda: iter([make().reshape(shape)])))

    def copy(self, name: str, hf: str, shape: tuple[int, ...], plus_one: bool = False) -> None:
        self.need(hf, shape)
        if plus_one:  # HF's zero-centred RMSNorm gammas compute x * (1 + w)
            self.emit(name, shape, lambda: self.load(hf) + np.float32(1))
        else:
            self.emit(name, shape, lambda: self.load(hf))

    def check(self) -> None:
        missing = [n for n in self.expected if n not in self.present]
        if missing:
            raise ConvertError(f"checkpoint is missing {len(missing)} tensor(s): {_few(missing)}")
        extra = [self.present[n] for n in self.present if n not in self.expected]
        if extra:
            raise ConvertError(f"checkpoint has {len(extra)} unexpected tensor(s): {_few(extra)}")
        for n, shape in self.expected.items():
            got = tuple(self.src.shape(self.present[n]))
            if got != shape:
                raise ConvertError(
                    f"tensor {self.present[n]} has shape {list(got)}, expected {list(shape)}"
                )


def _few(items: list[str], n: int = 3) -> str:
    more = f" (and {len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def plan_tensors(cfg: ModelConfig, src: TensorSource) -> Plan:
    """Check the source against the config and return the GGUF tensors to write."""
    b, ple = _build(cfg, src)
    b.check()
    return Plan(b.out, ple() if ple is not None else None)


def expected_shapes(cfg: ModelConfig, src: TensorSource) -> dict[str, tuple[int, ...]]:
    """The HF tensors (name -> shape) the config implies; src only decides layout variants."""
    return _build(cfg, src)[0].expected


def _build(
    cfg: ModelConfig, src: TensorSource
) -> tuple[_Builder, Callable[[], PleConstants] | None]:
    b = _Builder(cfg, src)
    E, V, hc, R = cfg.hidden_size, cfg.vocab_size, cfg.hc_count, cfg.hc_lowrank
    hcE = hc * E
    b.copy(N.TOKEN_EMBD, "model.embed_tokens.weight", (V, E))
    # a tied checkpoint may still carry lm_head; upstream ties when output is absent
    if not cfg.tie_word_embeddings or "lm_head.weight" in b.present:
        b.copy(N.OUTPUT, "lm_head.weight", (V, E))
    mixer = "model.hyper_connection_mixer."
    b.copy(N.OUTPUT_HC_NORM, mixer + "hc_norm.weight", (hcE,), plus_one=True)
    b.copy(N.OUTPUT_HC_DOWN, mixer + "input_mix_weight_down.weight", (R, hcE))
    b.copy(N.OUTPUT_HC_UP, mixer + "input_mix_weight_up.weight", (hcE, R))
    for il in range(cfg.n_layer):
        _layer(b, il)
    return b, (_ple(b) if cfg.ple_layer is not None else None)


def _layer(b: _Builder, il: int) -> None:
    cfg = b.cfg
    E, hc, R = cfg.hidden_size, cfg.hc_count, cfg.hc_lowrank
    hcE = hc * E
    p, g = f"model.layers.{il}.", N.BLK.format(il)
    for gg, hf in N.HC.items():
        m = p + hf + "."
        b.copy(g + gg + "_norm.weight", m + "hc_norm.weight", (hcE,), plus_one=True)
        b.copy(g + gg + "_down.weight", m + "input_mix_weight_down.weight", (R, hcE))
        b.copy(g + gg + "_up.weight", m + "input_mix_weight_up.weight", (hcE, R))
        b.copy(g + gg + "_inject.weight", m + "block_inject_weight.weight", (hc, hcE))
    if cfg.layer_types[il] == INDEXED:
        _attention(b, p + "self_attn.", g)
    else:
        _linear_attention(b, p + "linear_attn.", g)
    _moe(b, p + "mlp.", g)


def _attention(b: _Builder, p: str, g: str) -> None:
    cfg = b.cfg
    E, H, Hkv, D = cfg.hidden_size, cfg.n_head, cfg.n_head_kv, cfg.head_dim
    Hi, Di = cfg.indexer_n_heads, cfg.indexer_head_dim
    # q_proj rows are [q(D), gate(D)] per head, which the graph reads with stride 2D as is
    b.copy(g + "attn_q.weight", p + "q_proj.weight", (2 * H * D, E))
    b.copy(g + "attn_k.weight", p + "k_proj.weight", (Hkv * D, E))
    b.copy(g + "attn_v.weight", p + "v_proj.weight", (Hkv * D, E))
    b.copy(g + "attn_output.weight", p + "o_proj.weight", (E, H * D))
    b.copy(g + "attn_q_norm.weight", p + "q_norm.weight", (D,), plus_one=True)
    b.copy(g + "attn_k_norm.weight", p + "k_norm.weight", (D,), plus_one=True)
    qk = b.need(p + "indexer.index_qk_proj.weight", ((Hi + 1) * Di, E))
    b.emit(g + "indexer.q_proj.weight", (Hi * Di, E), lambda: b.load(qk)[: Hi * Di])
    b.emit(g + "indexer.k_proj.weight", (Di, E), lambda: b.load(qk)[Hi * Di :])
    b.copy(g + "indexer.q_norm.weight", p + "indexer.q_layernorm.weight", (Di,), plus_one=True)
    b.copy(g + "indexer.k_norm.weight", p + "indexer.k_layernorm.weight", (Di,), plus_one=True)


def _linear_attention(b: _Builder, p: str, g: str) -> None:
    cfg = b.cfg
    E, nk, nv, hd, Kc = (
        cfg.hidden_size,
        cfg.ssm_n_k_heads,
        cfg.ssm_n_v_heads,
        cfg.ssm_head_dim,
        cfg.ssm_conv_kernel,
    )
    key_dim, val_dim = nk * hd, nv * hd
    conv_dim = 2 * key_dim + val_dim

    def rv(a: np.ndarray, axis: int, width: int) -> np.ndarray:
        return reorder_v(a, axis, nk, nv, width)

    def qkv_rows(a: np.ndarray) -> np.ndarray:  # [q; k] unchanged, V heads reordered
        return np.concatenate([a[: 2 * key_dim], rv(a[2 * key_dim :], 0, hd)], axis=0)

    qkv = b.need(p + "in_proj_qkv.weight", (conv_dim, E))
    b.emit(g + "attn_qkv.weight", (conv_dim, E), lambda: qkv_rows(b.load(qkv)))
    z = b.need(p + "in_proj_z.weight", (val_dim, E))
    b.emit(g + "attn_gate.weight", (val_dim, E), lambda: rv(b.load(z), 0, hd))
    beta = b.need(p + "in_proj_b.weight", (nv, E))
    b.emit(g + "ssm_beta.weight", (nv, E), lambda: rv(b.load(beta), 0, 1))
    alpha = b.need(p + "in_proj_a.weight", (nv, E))
    b.emit(g + "ssm_alpha.weight", (nv, E), lambda: rv(b.load(alpha), 0, 1))
    a_log = b.need(p + "A_log", (nv,))
    b.emit(g + "ssm_a", (nv,), lambda: -np.exp(rv(b.load(a_log), 0, 1).astype(np.float64)))
    dt = b.need(p + "dt_bias", (nv,))
    b.emit(g + "ssm_dt.bias", (nv,), lambda: rv(b.load(dt), 0, 1))
    conv = b.need(p + "conv1d.weight", (conv_dim, 1, Kc))
    b.emit(g + "ssm_conv1d.weight", (conv_dim, Kc), lambda: qkv_rows(b.load(conv)[:, 0, :]))
    # the gated norm multiplies by a plain gamma (HF inits it to ones): no +1 here
    b.copy(g + "ssm_norm.weight", p + "norm.weight", (hd,))
    out = b.need(p + "out_proj.weight", (E, val_dim))
    b.emit(g + "ssm_out.weight", (E, val_dim), lambda: rv(b.load(out), 1, hd))


def _moe(b: _Builder, p: str, g: str) -> None:
    cfg = b.cfg
    E, X, F, Fs = cfg.hidden_size, cfg.n_expert, cfg.expert_ff, cfg.shexp_ff
    b.copy(g + "ffn_gate_inp.weight", p + "gate.weight", (X, E))
    gate = b.need(p + "shared_expert_gate.weight", (1, E))
    b.emit(g + "ffn_gate_inp_shexp.weight", (E,), lambda: b.load(gate)[0])
    b.copy(g + "ffn_gate_shexp.weight", p + "shared_expert.gate_proj.weight", (Fs, E))
    b.copy(g + "ffn_up_shexp.weight", p + "shared_expert.up_proj.weight", (Fs, E))
    b.copy(g + "ffn_down_shexp.weight", p + "shared_expert.down_proj.weight", (E, Fs))
    if p + "experts.gate_up_proj" in b.present:  # fused runtime layout
        gu = b.need(p + "experts.gate_up_proj", (X, 2 * F, E))
        b.emit(g + "ffn_gate_exps.weight", (X, F, E), lambda: b.load(gu)[:, :F])
        b.emit(g + "ffn_up_exps.weight", (X, F, E), lambda: b.load(gu)[:, F:])
        b.copy(g + "ffn_down_exps.weight", p + "experts.down_proj", (X, E, F))
        return
    shapes = {"gate": (F, E), "up": (F, E), "down": (E, F)}  # save_pretrained's layout
    for w, shape in shapes.items():
        hf = [b.need(p + f"experts.{e}.{w}_proj.weight", shape) for e in range(X)]
        b.emit(
            g + f"ffn_{w}_exps.weight",
            (X, *shape),
            lambda hf=hf: np.stack([b.load(n) for n in hf]),
        )


def _ple(b: _Builder) -> Callable[[], PleConstants]:
    cfg = b.cfg
    il = cfg.ple_layer
    assert il is not None
    E, hcE, Pk = cfg.hidden_size, cfg.hc_count * cfg.hidden_size, cfg.ple_conv_kernel
    p, g = f"model.layers.{il}.ple.", N.BLK.format(il)
    b.copy(g + "ple_key.weight", p + "key_proj.weight", (hcE, E))
    b.copy(g + "ple_value.weight", p + "value_proj.weight", (E, E))
    for n in ("key", "query", "conv"):
        b.copy(g + f"ple_norm_{n}.weight", p + f"norm_{n}.weight", (hcE,), plus_one=True)
    conv = b.need(p + "conv1d.weight", (hcE, 1, Pk))
    b.emit(g + "ple_conv1d.weight", (hcE, Pk), lambda: b.load(conv)[:, 0, :])
    e = p + "ple_embedding."
    nh = cfg.ple_n_heads
    consts = {
        "layer_multipliers": b.need(e + "layer_multipliers", (cfg.ngram_size,)),
        "head_offsets": b.need(e + "ngram_heads_offsets", (nh,)),
        "head_vocab_sizes": b.need(e + "ngram_heads_vocab_sizes", (nh,)),
    }
    # save_pretrained shards the table (split_ngram_parts); a runtime dump has one weight
    one = e + "ngram_embedding.weight"
    shards = (
        [one]
        if one in b.present
        else [e + f"ngram_embedding.shard_{s}.weight" for s in range(cfg.split_ngram_parts)]
    )
    rows = [b.present.get(s) and b.src.shape(b.present[s])[0] for s in shards]
    Pd = cfg.ple_row_dim
    for s, r in zip(shards, rows, strict=True):
        b.need(s, (r or 0, Pd))
    n_rows = sum(r or 0 for r in rows)

    def chunks() -> Iterator[np.ndarray]:
        for s in shards:  # one shard resident at a time: real tables exceed 100 GB
            yield b.load(s)

    def finish() -> PleConstants:
        # int64 constants are read exactly (never through a float)
        c = {k: [int(x) for x in b.load(n)] for k, n in consts.items()}
        need = ple_rows_needed(c["head_offsets"], c["head_vocab_sizes"])
        if n_rows < need:
            raise ConvertError(f"PLE n-gram table has {n_rows} rows, the hash ranges need {need}")
        return PleConstants(row_dim=Pd, **c)

    b.out.append(OutTensor(N.PER_LAYER_TOKEN_EMBD, (n_rows, Pd), chunks))
    return finish
