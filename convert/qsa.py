"""pyqsa's QSA keys: the layer map, per-layer ratio and budget, and the KV scales."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGUFValueType as T

from . import names as N
from .errors import ConvertError
from .gguf_file import GGUFFile
from .hf_config import ModelConfig
from .writer import KV


@dataclass(frozen=True)
class QsaLayout:
    """Which layers are indexed attention ("sink layers") and the geometry their KV has."""

    n_layer: int
    layers: tuple[int, ...]
    ratios: tuple[int, ...]  # one per indexed layer
    budgets: tuple[int, ...]  # tokens, one per indexed layer
    n_head_kv: int
    head_dim: int
    n_embd: int
    hc_count: int

    @property
    def n_scales(self) -> int:
        return len(self.layers) * self.n_head_kv

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> QsaLayout:
        layers = tuple(cfg.qsa_layers)
        return cls(
            n_layer=cfg.n_layer,
            layers=layers,
            ratios=(cfg.compress_ratio,) * len(layers),
            budgets=(cfg.indexer_budget,) * len(layers),
            n_head_kv=cfg.n_head_kv,
            head_dim=cfg.head_dim,
            n_embd=cfg.hidden_size,
            hc_count=cfg.hc_count,
        )

    @classmethod
    def from_gguf(cls, g: GGUFFile, require_ratios: bool = True) -> QsaLayout:
        """Read from qwen4exp keys; refuses ratio 0 on indexed layers unless told not to."""
        get, path = g.get, g.path
        arch = get("general.architecture")
        if arch != N.ARCH:
            raise ConvertError(f"{path}: architecture {arch!r} is not {N.ARCH!r}")
        n_layer = int(get(N.BLOCK_COUNT))
        recurrent = get(N.RECURRENT_LAYERS)
        if recurrent is None:
            interval = int(get(N.FULL_ATTENTION_INTERVAL, 4))
            recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
        ratios = get(N.COMPRESS_RATIOS, 0)
        ratios = ratios if isinstance(ratios, list) else [ratios] * n_layer
        layers = tuple(i for i in range(n_layer) if not recurrent[i])
        off = [i for i in layers if ratios[i] <= 0]
        if off and require_ratios:
            raise ConvertError(
                f"{path}: compress ratio is 0 on indexed layers {off} (QSA off, as upstream's "
                "converter writes it); convert the HF checkpoint again with pyqsa convert"
            )
        budget = int(get(N.INDEXER_TOP_K))
        return cls(
            n_layer=n_layer,
            layers=layers,
            ratios=tuple(int(ratios[i]) for i in layers),
            budgets=(budget,) * len(layers),
            n_head_kv=int(get(N.HEAD_COUNT_KV)),
            head_dim=int(get(N.KEY_LENGTH)),
            n_embd=int(get(N.EMBEDDING_LENGTH)),
            hc_count=int(get(N.HC_COUNT)),
        )


@dataclass(frozen=True)
class KVScales:
    """Absmax per (indexed layer, KV head) of K and V, layer-major; see names.py."""

    k: tuple[float, ...]
    v: tuple[float, ...]
    source: str  # "calibrated:<n> tokens" or "weight-estimate"


def pyqsa_kv(layout: QsaLayout, scales: KVScales) -> list[KV]:
    if len(scales.k) != layout.n_scales or len(scales.v) != layout.n_scales:
        raise ConvertError(f"KV scales: expected {layout.n_scales} per tensor")
    u32 = T.UINT32
    return [
        (N.PYQSA_CONVERTER_VERSION, N.CONVERTER_VERSION, T.STRING, None),
        (N.PYQSA_QSA_LAYERS, list(layout.layers), T.ARRAY, u32),
        (N.PYQSA_QSA_COMPRESS_RATIO, list(layout.ratios), T.ARRAY, u32),
        (N.PYQSA_QSA_BUDGET, list(layout.budgets), T.ARRAY, u32),
        (N.PYQSA_KV_SCALES_K, [float(x) for x in scales.k], T.ARRAY, T.FLOAT32),
        (N.PYQSA_KV_SCALES_V, [float(x) for x in scales.v], T.ARRAY, T.FLOAT32),
        (N.PYQSA_KV_SCALES_SOURCE, scales.source, T.STRING, None),
    ]
