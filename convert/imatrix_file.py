"""Importance-matrix files as llama.cpp writes and reads them, and what the quantize API takes.

The GGUF format (llama-imatrix's default): per weight, `<name>.in_sum2` f32 [n_mat, n_cols], the
squared inputs summed per matrix (expert), and `<name>.counts` f32 [n_mat, 1], the rows summed;
keys `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`. The legacy `.dat` format
(read only): per weight its name, ncall and (sum / count) * ncall. llama_model_quantize takes,
per weight, the mean squared input per column and matrix (an expert never routed to gets ones),
as llama-quantize computes it from either file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

from pyqsa.native import ImatrixEntry

from .errors import ConvertError
from .gguf_file import GGUFFile

SUMS, COUNTS = ".in_sum2", ".counts"


@dataclass(frozen=True)
class Imatrix:
    entries: dict[str, ImatrixEntry]
    chunk_count: int
    chunk_size: int  # tokens a chunk (0 in a legacy file)
    datasets: tuple[str, ...]

    def means(self) -> dict[str, np.ndarray]:
        """Weight name -> flat float32 [n_mat * n_cols]: the quantize API's importance data."""
        out = {}
        for name, e in self.entries.items():
            counts = np.broadcast_to(e.counts, (e.sums.shape[0],)).astype(np.float64)
            rows = np.where(counts[:, None] > 0, e.sums / np.maximum(counts, 1)[:, None], 1.0)
            out[name] = np.ascontiguousarray(rows, dtype=np.float32).ravel()
        return out

    def unrouted(self) -> int:
        """Experts (matrices of MoE weights) no token was routed to, over every entry."""
        return sum(int((e.counts == 0).sum()) for e in self.entries.values() if e.counts.size > 1)


def write_imatrix(im: Imatrix, out: Path, progress: bool = False) -> None:
    """Write `im` in llama.cpp's imatrix GGUF format, atomically."""
    from .writer import Item, write_gguf

    kvs = [
        ("general.type", "imatrix", T.STRING, None),
        ("imatrix.chunk_count", im.chunk_count, T.UINT32, None),
        ("imatrix.chunk_size", im.chunk_size, T.UINT32, None),
    ]
    if im.datasets:  # gguf-py writes no empty arrays
        kvs.append(("imatrix.datasets", list(im.datasets), T.ARRAY, T.STRING))
    items = []
    for name, e in sorted(im.entries.items()):
        counts = np.broadcast_to(e.counts, (e.sums.shape[0],)).astype(np.float32)[:, None]
        for suffix, arr in ((SUMS, e.sums.astype(np.float32)), (COUNTS, counts)):
            items.append(Item(name + suffix, arr.shape, Q.F32, lambda a=arr: iter([a])))
    write_gguf(out, kvs, items, progress=progress)


def read_imatrix(path: str | Path) -> Imatrix:
    """An imatrix GGUF or legacy .dat file; one-line errors for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path}: not found")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _read_gguf(path)
    try:
        return _read_legacy(path.read_bytes())
    except (struct.error, UnicodeDecodeError, ValueError):
        raise ConvertError(
            f"{path}: not an importance matrix (llama.cpp's imatrix GGUF or legacy .dat)"
        ) from None


def _read_gguf(path: Path) -> Imatrix:
    g = GGUFFile(path)
    by_name = {t.name: t for t in g.tensors}
    names = sorted(n[: -len(SUMS)] for n in by_name if n.endswith(SUMS))
    if not names:
        raise ConvertError(f"{path}: not an importance matrix (no {SUMS} tensors)")
    entries = {}
    for name in names:
        sums, counts = by_name[name + SUMS], by_name.get(name + COUNTS)
        if counts is None or sums.qtype != Q.F32 or counts.qtype != Q.F32:
            raise ConvertError(f"{path}: {name} needs f32 {SUMS} and {COUNTS} tensors")
        s = g.f32(sums).reshape(-1, sums.ne[0])
        c = np.rint(g.f32(counts).ravel()).astype(np.int64)
        if c.size not in (1, s.shape[0]):
            raise ConvertError(f"{path}: {name} has {c.size} counts for {s.shape[0]} matrices")
        entries[name] = ImatrixEntry(s, c)
    datasets = g.get("imatrix.datasets", [])
    return Imatrix(
        entries,
        int(g.get("imatrix.chunk_count", 0)),  # type: ignore[arg-type]
        int(g.get("imatrix.chunk_size", 0)),  # type: ignore[arg-type]
        tuple(datasets),  # type: ignore[arg-type]
    )


def _read_legacy(data: bytes) -> Imatrix:
    pos = 0

    def take(fmt: str):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v

    (n_entries,) = take("i")
    if n_entries < 1:
        raise ValueError("no entries")
    entries = {}
    for _ in range(n_entries):
        (n,) = take("i")
        name = data[pos : pos + n].decode("utf-8")
        pos += n
        ncall, nval = take("ii")
        if nval < 1 or pos + 4 * nval > len(data):
            raise ValueError("bad entry")
        vals = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        # (sum / count) * ncall: means() divides by ncall again (llama-quantize keeps ncall 0's)
        entries[name] = ImatrixEntry(vals[None, :], np.array([max(ncall, 1)], dtype=np.int64))
    chunks, datasets = 0, ()
    if pos + 4 <= len(data):
        (chunks,) = take("i")
        if pos + 4 <= len(data):
            (n,) = take("i")
            datasets = (data[pos : pos + n].decode("utf-8", errors="replace"),)
    return Imatrix(entries, chunks, 0, datasets)
