"""Atomic GGUF writing: header and metadata through gguf's writer, tensor data streamed.

The file is written to a hidden temp file next to the output and renamed over it only when
complete, so an error or Ctrl-C never leaves a partial file (nor the temp file). Free space is
checked first; a tqdm bar shows the bytes written.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

from . import names as N
from .errors import ConvertError
from .tensors import OutTensor

KV = tuple[str, object, T, "T | None"]  # key, value, type, array sub-type
OUTTYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}
FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
_SLACK = 16 << 20  # headroom over the exact size (metadata, alignment padding)


@dataclass(frozen=True)
class Item:
    """A tensor as it goes to disk: `chunks()` yields arrays already encoded as `qtype`."""

    name: str
    shape: tuple[int, ...]  # numpy order
    qtype: Q
    chunks: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape, dtype=np.int64)) // block * size


def tensor_type(t: OutTensor, outtype: str) -> Q:
    """Norms, 1-D, router and conv tensors stay f32; q8_0 needs rows of 32 (else f16)."""
    if t.keep_f32 or outtype == "f32":
        return Q.F32
    q = OUTTYPES[outtype]
    if q == Q.Q8_0 and t.shape[-1] % 32:
        return Q.F16
    return q


def encode(t: OutTensor, outtype: str) -> Item:
    q = tensor_type(t, outtype)

    def chunks() -> Iterator[np.ndarray]:
        for c in t.chunks():
            yield gguf.quants.quantize(np.ascontiguousarray(c, dtype=np.float32), q)

    return Item(t.name, t.shape, q, chunks)


def temp_path(out: Path) -> Path:
    """A hidden sibling, unique per call (concurrent writers of one output never collide)."""
    return out.parent / f".{out.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"


def check_output(out: Path, nbytes: int) -> None:
    """Refuse an output path that cannot be written, or a disk without room for nbytes."""
    if out.is_dir():
        raise ConvertError(f"cannot write {out}: it is a directory")
    parent = out.parent
    if not parent.is_dir():
        why = "is not a folder" if parent.exists() else "does not exist"
        raise ConvertError(f"cannot write {out}: {parent} {why}")
    need = nbytes + _SLACK
    free = shutil.disk_usage(parent).free
    if free < need:
        raise ConvertError(
            f"not enough disk space in {parent}: need {need / 2**30:.2f} GiB, "
            f"{free / 2**30:.2f} GiB free"
        )


def write_gguf(out: Path, kvs: list[KV], items: list[Item], progress: bool = True) -> None:
    """Write a qwen4exp GGUF atomically (temp file in the same folder, then rename)."""
    out = Path(out)
    check_output(out, sum(i.nbytes for i in items))
    tmp = temp_path(out)
    try:
        open(tmp, "xb").close()
    except OSError as e:
        raise ConvertError(f"cannot write {out}: {e.strerror}") from None
    try:
        _write(tmp, kvs, items, progress)
        os.replace(tmp, out)
    except BaseException as e:  # Ctrl-C included: never leave the temp file behind
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise ConvertError(f"writing {out} failed: {e.strerror or e}") from None
        raise


def _write(path: Path, kvs: list[KV], items: list[Item], progress: bool) -> None:
    from tqdm import tqdm

    w = gguf.GGUFWriter(None, N.ARCH)
    for key, val, vtype, sub in kvs:
        w.add_key_value(key, val, vtype, sub_type=sub)
    for it in items:
        w.add_tensor_info(it.name, it.shape, np.dtype(np.float32), it.nbytes, raw_dtype=it.qtype)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    f = w.fout[0]
    total = sum(it.nbytes for it in items)
    with tqdm(total=total, unit="B", unit_scale=True, desc="writing", disable=not progress) as bar:
        for it in items:
            w.write_padding(f, f.tell())
            n = 0
            for c in it.chunks():
                c.tofile(f)
                n += c.nbytes
                bar.update(c.nbytes)
            if n != it.nbytes:
                raise ConvertError(f"tensor {it.name}: wrote {n} bytes, expected {it.nbytes}")
            w.write_padding(f, n)
    f.flush()
    os.fsync(f.fileno())
    w.close()
