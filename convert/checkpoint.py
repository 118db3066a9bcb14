"""Tensor sources: safetensors checkpoints read lazily, and in-memory numpy mappings.

Safetensors are parsed here directly (8-byte header length, JSON header, raw data) and
memory-mapped, so one tensor at a time is materialised and bf16 needs neither torch nor a
numpy bf16 type: its bits are widened to f32 by a 16-bit shift.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .errors import ConvertError

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # widened on load
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class TensorSource(Protocol):
    """What the tensor planner reads: names, shapes and one array at a time."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def load(self, name: str) -> np.ndarray:
        """The tensor as f32 (floats) or int64 (integers), in HF (torch) axis order."""
        ...


def _widen(a: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(np.float32, copy=False)
    return a.astype(np.int64, copy=False)


class ArraySource:
    """In-memory tensors keyed by HF name (for write_model and tests)."""

    def __init__(self, tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]):
        items = tensors.items() if isinstance(tensors, Mapping) else tensors
        self._t = {name: np.asarray(a) for name, a in items}

    def names(self) -> list[str]:
        return list(self._t)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._t[name].shape)

    def load(self, name: str) -> np.ndarray:
        return _widen(self._t[name])


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int


def _read_header(path: Path) -> dict[str, _Entry]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConvertError(f"{path}: corrupt safetensors file (truncated header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100 << 20:
                raise ConvertError(f"{path}: corrupt safetensors file (bad header length {n})")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ConvertError(f"{path}: unreadable safetensors file ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConvertError(f"{path}: corrupt safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: corrupt safetensors file (header is not a JSON object)")
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = info["dtype"], tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{path}: corrupt safetensors header entry for {name}") from None
        if dtype not in _DTYPES:
            raise ConvertError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if end - begin != nbytes or begin < 0 or base + end > size:
            raise ConvertError(
                f"{path}: corrupt safetensors file (tensor {name} data out of bounds or "
                f"wrong size; the file may be truncated)"
            )
        out[name] = _Entry(path, dtype, shape, base + begin, base + end)
    return out


class SafetensorsSource:
    """All tensors of a checkpoint folder (model.safetensors, or shards with an index)."""

    def __init__(self, hf_dir: Path):
        hf_dir = Path(hf_dir)
        index = hf_dir / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                files = sorted({hf_dir / f for f in weight_map.values()})
            except (OSError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
                raise ConvertError(f"{index}: unreadable shard index ({e})") from None
            for f in files:
                if not f.exists():
                    raise ConvertError(f"{index}: shard {f.name} is missing")
        else:
            files = sorted(hf_dir.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{hf_dir}: no .safetensors files found")
        self._entries: dict[str, _Entry] = {}
        for f in files:
            for name, e in _read_header(f).items():
                if name in self._entries:
                    raise ConvertError(f"{f}: tensor {name} also appears in another shard")
                self._entries[name] = e
        self._maps: dict[Path, np.memmap] = {}

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def load(self, name: str) -> np.ndarray:
        e = self._entries[name]
        if e.file not in self._maps:
            try:
                self._maps[e.file] = np.memmap(e.file, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as err:
                raise ConvertError(f"{e.file}: unreadable safetensors file ({err})") from None
        raw = self._maps[e.file][e.begin : e.end]
        a = raw.view(_DTYPES[e.dtype]).reshape(e.shape)
        if e.dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return _widen(a)
