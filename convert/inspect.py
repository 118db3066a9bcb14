"""`pyqsa inspect`: what a qwen4exp GGUF holds (layer map, QSA parameters, scales, tensors)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from . import names as N
from .gguf_file import GGUFFile
from .qsa import QsaLayout


@dataclass(frozen=True)
class QsaLayerInfo:
    layer: int
    compress_ratio: int
    budget: int
    k_scales: list[float]
    v_scales: list[float]


@dataclass(frozen=True)
class Summary:
    path: str
    architecture: str
    name: str | None
    n_layer: int
    layer_map: str  # one letter per layer: L = linear attention (GDN), Q = QSA indexed
    qsa_layers: list[QsaLayerInfo]
    pyqsa_keys_in_sync: bool  # pyqsa.qsa.* agree with the qwen4exp keys the runtime reads
    kv_scales_source: str | None
    converter_version: str | None
    output_gate: str | None
    ple_layers: list[int]
    n_tensors: int
    n_bytes: int
    bytes_by_type: dict[str, int]
    tensors_by_type: dict[str, int]

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(path: str | Path) -> Summary:
    path = Path(path)
    g = GGUFFile(path)
    get = g.get
    # the layer map, ratios and budget the runtime uses come from the qwen4exp keys
    layout = QsaLayout.from_gguf(g, require_ratios=False)
    H = layout.n_head_kv
    ks, vs = get(N.PYQSA_KV_SCALES_K, []), get(N.PYQSA_KV_SCALES_V, [])
    qsa = [
        QsaLayerInfo(
            il,
            layout.ratios[j],
            layout.budgets[j],
            ks[j * H : (j + 1) * H],
            vs[j * H : (j + 1) * H],
        )
        for j, il in enumerate(layout.layers)
    ]
    pyqsa_map = [get(N.PYQSA_QSA_LAYERS), get(N.PYQSA_QSA_COMPRESS_RATIO), get(N.PYQSA_QSA_BUDGET)]
    in_sync = pyqsa_map == [list(layout.layers), list(layout.ratios), list(layout.budgets)]
    by_type: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for t in g.tensors:
        by_type[t.qtype.name] += t.nbytes
        count[t.qtype.name] += 1
    return Summary(
        path=str(path),
        architecture=get("general.architecture"),
        name=get("general.name"),
        n_layer=layout.n_layer,
        layer_map="".join("Q" if i in layout.layers else "L" for i in range(layout.n_layer)),
        pyqsa_keys_in_sync=in_sync,
        qsa_layers=qsa,
        kv_scales_source=get(N.PYQSA_KV_SCALES_SOURCE),
        converter_version=get(N.PYQSA_CONVERTER_VERSION),
        output_gate=get(N.SSM_OUTPUT_GATE),
        ple_layers=get(N.PLE_LAYERS, []),
        n_tensors=len(g.tensors),
        n_bytes=sum(by_type.values()),
        bytes_by_type=dict(by_type),
        tensors_by_type=dict(count),
    )


def size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def render(s: Summary) -> str:
    def fmt(xs: list[float]) -> str:
        return "[" + ", ".join(f"{x:.4g}" for x in xs) + "]"

    lines = [
        f"file:          {s.path}",
        f"architecture:  {s.architecture}" + (f" ({s.name})" if s.name else ""),
        f"layers:        {s.n_layer} ({s.layer_map.count('L')} linear attention, "
        f"{len(s.qsa_layers)} QSA)",
        f"layer map:     {s.layer_map}   (L = linear attention, Q = QSA indexed attention)",
        f"QSA layers:    {', '.join(str(q.layer) for q in s.qsa_layers) or 'none'}",
    ]
    for q in s.qsa_layers:
        if q.compress_ratio <= 0:
            lines.append(
                f"  layer {q.layer:3d}: ratio 0: QSA OFF (dense attention; convert the HF "
                "checkpoint again with pyqsa convert)"
            )
            continue
        lines.append(
            f"  layer {q.layer:3d}: ratio {q.compress_ratio}, budget {q.budget} tokens "
            f"({q.budget // q.compress_ratio} blocks), K absmax {fmt(q.k_scales)}, "
            f"V absmax {fmt(q.v_scales)}"
        )
    if s.converter_version and not s.pyqsa_keys_in_sync:
        lines.append(
            "  WARNING: pyqsa.qsa.* keys disagree with the qwen4exp keys (run --refresh-qsa)"
        )
    lines += [
        f"KV scales:     {s.kv_scales_source or 'absent (not converted by pyqsa)'}",
        f"converter:     {'pyqsa ' + s.converter_version if s.converter_version else 'not pyqsa'}",
        f"output gate:   {s.output_gate or 'absent (upstream assumes sigmoid)'}",
        f"PLE layers:    {', '.join(map(str, s.ple_layers)) or 'none'}",
        f"tensors:       {s.n_tensors}, {size_text(s.n_bytes)}",
    ]
    for t in sorted(s.bytes_by_type, key=lambda t: -s.bytes_by_type[t]):
        lines.append(f"  {t:6s} {s.tensors_by_type[t]:5d} tensors  {size_text(s.bytes_by_type[t])}")
    return "\n".join(lines)
