"""`pyqsa quantize`: a qwen4exp GGUF to a quantized one through libllama's quantize API.

llama.cpp chooses each tensor's type from the file type (the _M mixtures give attn_v, ffn_down
and output more bits) and already keeps norms, the router, the GDN conv and the indexer
projections at their input type. On top of that `POLICY` sets two small kinds of tensors: the
Gated DeltaNet's decay and write gates at Q8_0 whatever the type, and the PLE conv at f32
(docs/convert.md, "What quantization costs", has the measurements). Every other key of the
input, pyqsa.* included, is copied by the API. An importance matrix (`--imatrix`: from `pyqsa
imatrix` or llama-imatrix) weights each tensor's rounding by its columns' mean squared input, as
llama-quantize gives it.

The output is written to a hidden temp file beside it and renamed over it when complete.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from . import names as N
from .errors import ConvertError
from .gguf_file import GGUFFile
from .writer import temp_path


@dataclass(frozen=True)
class QuantType:
    ftype: int  # llama_ftype (llama.h)
    base: Q  # the type most tensors get


# the file types libllama writes without an importance matrix (llama.h's llama_ftype)
TYPES = {
    "Q8_0": QuantType(7, Q.Q8_0),
    "Q6_K": QuantType(18, Q.Q6_K),
    "Q5_K_M": QuantType(17, Q.Q5_K),
    "Q5_K_S": QuantType(16, Q.Q5_K),
    "Q5_0": QuantType(8, Q.Q5_0),
    "Q4_K_M": QuantType(15, Q.Q4_K),
    "Q4_K_S": QuantType(14, Q.Q4_K),
    "Q4_0": QuantType(2, Q.Q4_0),
    "IQ4_NL": QuantType(25, Q.IQ4_NL),
    "IQ4_XS": QuantType(30, Q.IQ4_XS),
    "Q3_K_M": QuantType(12, Q.Q3_K),
}

# regex (searched in the tensor name) -> (the type it gets, why)
# NOTE: the gates were kept f32 at first: no measurable gain on the tiny models against
# llama.cpp's own choice, and on the GPU their f32 products at 8 sequences made a full-shape
# Q4_K_M file decode 5% slower than llama-quantize's (docs/convert.md, "On the GPU"); Q8_0 keeps
# them near f16's precision on the quantized products' path. The hyper-connection mixers get
# llama.cpp's type like the other matrices: kept f32 they made no measurable difference either
# and, 1.2 GiB in f16 at the full shape, made a Q4_K_M file decode slower than its f16 source.
POLICY = {
    r"ssm_(alpha|beta)\.weight$": (Q.Q8_0, "GDN decay and write gates (through exp and sigmoid)"),
    r"ple_conv1d\.weight$": (Q.F32, "PLE conv (rows of 4: would fall back to f16)"),
}

_PROGRESS = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")
_FAILED = "failed to quantize: "
_SLACK = 16 << 20


def parse_type(name: str) -> QuantType:
    t = TYPES.get(name.upper())
    if t is None:
        raise ConvertError(f"unknown quantization type {name!r} (choose {', '.join(TYPES)})")
    return t


def open_input(src: Path, verb: str = "quantizes") -> GGUFFile:
    """The qwen4exp GGUF at `src`; one-line errors for a missing or foreign file."""
    if not src.exists():
        raise ConvertError(f"{src}: not found")
    g = GGUFFile(src)
    arch = g.get("general.architecture")
    if arch != N.ARCH:
        raise ConvertError(f"{src}: architecture {arch!r}, pyqsa {verb} {N.ARCH} models only")
    return g


# what libllama keeps at its input type in a qwen4exp file (besides 1-D tensors): norms, the
# router, the GDN conv, the indexer projections
LLAMA_KEEPS = (r"_norm\.weight$", r"ffn_gate_inp", r"ssm_conv1d", r"indexer\.(q|k)_proj")


def size_bound(g: GGUFFile) -> int:
    """Bytes the output can take at most, whatever TYPES' type: a tensor libllama quantizes
    takes at most Q8_0's bytes (no type's mixture gives one more bits; a row that Q8_0's blocks
    do not divide falls back to f16 at most); one it keeps stays as it is; POLICY's take their
    type's. A 33 GiB f16 model's Q4_K_M needs about half its size free, not all of it."""
    policy = [(re.compile(p), ty) for p, (ty, _) in POLICY.items()]
    kept = [re.compile(p) for p in LLAMA_KEEPS]
    total = 0
    for t in g.tensors:
        n = int(np.prod(t.ne, dtype=np.int64))
        ty = next((ty for p, ty in policy if p.search(t.name)), None)  # F32 or Q8_0
        if ty == Q.F32:
            total += 4 * n
        elif ty is None and (len(t.ne) < 2 or any(p.search(t.name) for p in kept)):
            total += t.nbytes
        elif t.ne[0] % 32 == 0:
            total += n // 32 * 34  # Q8_0: 32 weights in 34 bytes
        else:
            total += 2 * n
    return total


def _check_room(out: Path, need: int) -> None:
    if out.is_dir():
        raise ConvertError(f"cannot write {out}: it is a directory")
    if not out.parent.is_dir():
        raise ConvertError(f"cannot write {out}: {out.parent} does not exist")
    free = shutil.disk_usage(out.parent).free
    if free < need + _SLACK:
        raise ConvertError(
            f"not enough disk space in {out.parent}: need up to {(need + _SLACK) / 2**30:.2f} "
            f"GiB, {free / 2**30:.2f} GiB free"
        )


@contextmanager
def _llama_log(on_line) -> Iterator[None]:
    """Route libllama's log to `on_line(level, text)` for the duration, then restore it."""
    import llama_cpp as L

    old_cb, old_data = L.llama_log_callback(), ctypes.c_void_p()
    L.llama_log_get(ctypes.byref(old_cb), ctypes.byref(old_data))
    cb = L.llama_log_callback(
        lambda level, text, data: on_line(level, text.decode(errors="replace"))
    )
    L.llama_log_set(cb, None)
    try:
        yield
    finally:
        L.llama_log_set(old_cb, old_data)


def _params(qt: QuantType, threads: int, policy: bool):
    import llama_cpp as L

    p = L.llama_model_quantize_default_params()
    p.ftype = qt.ftype
    p.nthread = threads
    overrides = []
    if policy:
        items = [(pat.encode(), int(ty)) for pat, (ty, _) in POLICY.items()]
        arr = (L.llama_model_tensor_override * (len(items) + 1))()
        for i, (pat, ty) in enumerate(items):
            arr[i].pattern, arr[i].type = pat, ty
        arr[len(items)].pattern = None  # the list ends at a null pattern
        p.tt_overrides = ctypes.cast(arr, type(p.tt_overrides))
        overrides.append(arr)  # the array must outlive the call
    return p, overrides


def _set_imatrix(p, path: Path, g: GGUFFile) -> list[object]:
    """Give the quantize parameters `p` the importance matrix at `path`, and the keys
    llama-quantize records with one; returns what must outlive the call."""
    import llama_cpp as L

    from .imatrix_file import read_imatrix

    im = read_imatrix(path)
    means = im.means()
    if not means.keys() & {t.name for t in g.tensors}:
        raise ConvertError(
            f"{path}: no entry names a tensor of {g.path} (an importance matrix of another model?)"
        )
    data = (L.llama_model_imatrix_data * (len(means) + 1))()
    for i, (name, v) in enumerate(means.items()):
        data[i].name, data[i].size = name.encode(), v.size
        data[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    data[len(means)].name = None  # the list ends at a null name
    p.imatrix = ctypes.cast(data, type(p.imatrix))
    keys: list[tuple[str, str | int]] = [("quantize.imatrix.file", str(path))]
    if im.datasets:
        keys.append(("quantize.imatrix.dataset", im.datasets[0]))
    keys.append(("quantize.imatrix.entries_count", len(means)))
    if im.chunk_count > 0:
        keys.append(("quantize.imatrix.chunks_count", im.chunk_count))
    kvs = (L.llama_model_kv_override * (len(keys) + 1))()
    for kv, (key, value) in zip(kvs, keys, strict=False):
        kv.key = key.encode()
        if isinstance(value, str):
            kv.tag, kv.value.val_str = L.LLAMA_KV_OVERRIDE_TYPE_STR, value.encode()[:127]
        else:
            kv.tag, kv.value.val_i64 = L.LLAMA_KV_OVERRIDE_TYPE_INT, value
    p.kv_overrides = ctypes.cast(kvs, type(p.kv_overrides))  # ends at an empty key
    return [means, data, kvs]


def quantize(
    src: str | Path,
    out: str | Path,
    type_name: str,
    *,
    threads: int = 0,
    policy: bool = True,
    imatrix: str | Path | None = None,
    progress: bool = True,
) -> Path:
    """Quantize the qwen4exp GGUF `src` to `out` as `type_name` (a key of TYPES), weighting
    each tensor's rounding by the importance matrix file `imatrix` when given.

    `policy=False` leaves every tensor to llama.cpp's own choice (for measurements)."""
    from tqdm import tqdm

    from pyqsa.engine.runner import _init_backend

    qt = parse_type(type_name)
    src, out = Path(src), Path(out)
    g = open_input(src)
    need = size_bound(g)
    _check_room(out, need)
    _init_backend()
    import llama_cpp as L

    params, keep_alive = _params(qt, threads, policy)
    if imatrix is not None:
        keep_alive += _set_imatrix(params, Path(imatrix), g)
    tmp = temp_path(out)
    errors: list[str] = []
    bar = tqdm(total=len(g.tensors), unit="tensor", desc="quantizing", disable=not progress)

    def on_line(level: int, text: str) -> None:
        m = _PROGRESS.match(text)
        if m:
            bar.update(int(m.group(1)) - bar.n)
        elif _FAILED in text:
            errors.append(text.split(_FAILED, 1)[1].strip())

    try:
        with _llama_log(on_line):
            rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise ConvertError(_failure(out, errors))
        os.replace(tmp, out)
    except BaseException:  # Ctrl-C included: never leave the temp file behind
        tmp.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
        del keep_alive
    return out


def _failure(out: Path, errors: list[str]) -> str:
    """One line: a full disk named as such (the API reports only a failed stream write)."""
    free = shutil.disk_usage(out.parent).free
    if free < _SLACK:
        return f"writing {out} failed: no space left on device ({free / 2**20:.0f} MiB free)"
    why = errors[-1] if errors else "see PYQSA_LLAMA_LOG=1"
    return f"quantizing to {out} failed: {why.splitlines()[0]}"


def convert_quantized(
    hf_dir: str | Path,
    out: str | Path,
    type_name: str,
    calibrate_text: str | None = None,
    progress: bool = True,
) -> Path:
    """`pyqsa convert --outtype Q4_K_M`: an f32 staging file beside `out`, then quantize it.

    f32, not f16, so the tensors llama.cpp keeps at their input type (the indexer projections)
    stay f32; the staging file takes 4 bytes a weight of disk until it is removed."""
    from .pipeline import convert_checkpoint

    parse_type(type_name)
    out = Path(out)
    staging = temp_path(out).with_suffix(".f32")
    try:
        convert_checkpoint(hf_dir, staging, "f32", calibrate_text, progress=progress)
        return quantize(staging, out, type_name, progress=progress)
    finally:
        staging.unlink(missing_ok=True)
