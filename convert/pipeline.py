"""The entry points: HF folder -> GGUF, in-memory weights -> GGUF, and refreshing QSA keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import names as N
from .calibrate import calibrate, weight_estimate
from .checkpoint import ArraySource, SafetensorsSource, TensorSource
from .errors import ConvertError
from .gguf_file import GGUFFile
from .hf_config import load_config, parse_config
from .metadata import model_kv
from .qsa import KVScales, QsaLayout, pyqsa_kv
from .tensors import plan_tensors
from .tokenizer import Tokenizer, load_tokenizer
from .writer import KV, OUTTYPES, Item, check_output, encode, temp_path, write_gguf

Tensors = TensorSource | Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]


def write_model(
    config: dict[str, Any],
    tensors: Tensors,
    tokenizer: Tokenizer | str | Path,
    out_path: str | Path,
    outtype: str = "f32",
    *,
    name: str = "qwen4exp",
    calibrate_text: str | None = None,
    progress: bool = False,
) -> Path:
    """Write a qwen4exp GGUF from an HF config dict and HF-named tensors.

    `tensors`: HF checkpoint names (as `Qwen4ExpForCausalLM.state_dict()` has them) to numpy
    arrays, as a mapping or (name, array) pairs, or a TensorSource. `tokenizer`: a Tokenizer,
    an HF tokenizer folder, or a vocab-only .gguf (see tokenizer.qwen_vocab_gguf()). KV scales
    are calibrated on `calibrate_text` when given, else estimated from the weights.
    """
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown outtype {outtype!r} (choose {', '.join(OUTTYPES)})")
    cfg = parse_config(config)
    src = tensors if hasattr(tensors, "load") else ArraySource(tensors)  # type: ignore[arg-type]
    plan = plan_tensors(cfg, src)  # type: ignore[arg-type]
    items = [encode(t, outtype) for t in plan.tensors]
    out = Path(out_path)
    check_output(out, sum(i.nbytes for i in items))  # fail fast, before the slow parts
    tok = load_tokenizer(tokenizer, cfg.vocab_size, config.get("model_type"))
    layout = QsaLayout.from_config(cfg)
    by_name = {t.name: t for t in plan.tensors}
    scales = weight_estimate(layout, lambda n: by_name[n].array())
    kvs = model_kv(cfg, plan.ple, outtype, name) + tok.kv() + pyqsa_kv(layout, scales)
    if calibrate_text is None:
        write_gguf(out, kvs, items, progress)
        return out
    # calibrate on a complete staging file, then write the output from it in one rename
    staging = temp_path(out).with_suffix(".calib")
    try:
        write_gguf(staging, kvs, items, progress)
        refresh_qsa(staging, calibrate_text, out_path=out, progress=progress)
    finally:
        staging.unlink(missing_ok=True)
    return out


def convert_checkpoint(
    hf_dir: str | Path,
    out_path: str | Path,
    outtype: str = "f32",
    calibrate_text: str | None = None,
    progress: bool = True,
) -> Path:
    """Convert an HF Qwen4-Exp checkpoint folder (safetensors + tokenizer) to GGUF."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ConvertError(f"{hf_dir}: not a folder")
    raw = load_config(hf_dir)
    parse_config(raw)  # config errors first, before the tensors are even opened
    return write_model(
        raw,
        SafetensorsSource(hf_dir),
        hf_dir,
        out_path,
        outtype,
        name=hf_dir.resolve().name,
        calibrate_text=calibrate_text,
        progress=progress,
    )


def refresh_qsa(
    path: str | Path,
    calibrate_text: str | None = None,
    *,
    out_path: str | Path | None = None,
    progress: bool = True,
) -> KVScales:
    """Rewrite only the pyqsa.* keys of a qwen4exp GGUF (tensors are copied byte for byte)."""
    path = Path(path)
    g = GGUFFile(path)
    layout = QsaLayout.from_gguf(g)
    if calibrate_text is not None:
        nfc = g.get(N.PYQSA_TOKENIZER_NORMALIZER) == "NFC"
        scales = calibrate(path, layout, calibrate_text, nfc=nfc)
    else:
        tensors = {t.name: t for t in g.tensors}

        def get(name: str) -> np.ndarray:
            if name not in tensors:
                raise ConvertError(f"{path}: tensor {name} is missing")
            return g.f32(tensors[name])

        scales = weight_estimate(layout, get)
    kvs: list[KV] = [
        (key, f.value, f.type, f.sub_type)
        for key, f in g.fields.items()
        if key not in N.PYQSA_KEYS and key != "general.architecture"
    ]
    kvs += pyqsa_kv(layout, scales)
    items = [Item(t.name, t.shape, t.qtype, lambda t=t: iter([g.raw(t)])) for t in g.tensors]
    write_gguf(Path(out_path) if out_path else path, kvs, items, progress)
    return scales
