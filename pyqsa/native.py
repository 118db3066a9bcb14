"""Bindings: pyqsa's own C API through cffi, upstream's through llama-cpp-python's ctypes.

Both live in the same patched libllama, staged in the installed `llama_cpp/lib` folder.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import cffi

if TYPE_CHECKING:
    import numpy as np

DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "ACCEL"}
GPU_TYPES = ("GPU", "iGPU")  # the DEVICE_TYPES that hold layers (--gpus, --device)


class NativeError(RuntimeError):
    """A pyqsa_* call returned an error code."""


def lib_dir() -> Path:
    """The folder holding the patched shared libraries and pyqsa.h."""
    import importlib.util
    import os

    if os.environ.get("LLAMA_CPP_LIB_PATH"):  # the bindings' own override: the same library
        return Path(os.environ["LLAMA_CPP_LIB_PATH"])
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise NativeError("llama_cpp (pyqsa's patched build) is not installed; run pip install .")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _cdef_from_header(header: Path) -> str:
    text = header.read_text()
    m = re.search(r"// cffi-begin[^\n]*\n(.*?)// cffi-end", text, re.S)
    if m is None:
        raise NativeError(f"{header}: no cffi-begin/cffi-end section")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return body.replace("PYQSA_API ", "")


@functools.cache
def _api():
    ffi = cffi.FFI()
    d = lib_dir()
    ffi.cdef(_cdef_from_header(d / "pyqsa.h"))
    # Loading through llama_cpp first makes sure ggml and llama are resolved once, in one place.
    import llama_cpp  # noqa: F401

    return ffi, ffi.dlopen(str(d / "libllama.so"))


@dataclass(frozen=True)
class BuildInfo:
    version: str
    upstream_commit: str
    backend: str
    cuda_archs: str


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    description: str
    type: str
    memory_free: int
    memory_total: int


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise NativeError(f"{what} failed with code {rc}")


def _supported(rc: int, what: str) -> bool:
    """False where the call answered PYQSA_ERR_UNSUPPORTED; True where it succeeded; else raises."""
    if rc == _api()[1].PYQSA_ERR_UNSUPPORTED:
        return False
    _check(rc, what)
    return True


def version() -> str:
    ffi, lib = _api()
    return ffi.string(lib.pyqsa_version()).decode()


def build_info() -> BuildInfo:
    ffi, lib = _api()
    out = ffi.new("pyqsa_build_info *")
    _check(lib.pyqsa_build_info_get(out), "pyqsa_build_info_get")
    return BuildInfo(
        version=ffi.string(out.version).decode(),
        upstream_commit=ffi.string(out.upstream_commit).decode(),
        backend="CUDA" if out.has_cuda else "CPU",
        cuda_archs=ffi.string(out.cuda_archs).decode(),
    )


def devices() -> list[DeviceInfo]:
    ffi, lib = _api()
    result = []
    for i in range(lib.pyqsa_device_count()):
        out = ffi.new("pyqsa_device_info *")
        _check(lib.pyqsa_device_info_get(i, out), f"pyqsa_device_info_get({i})")
        result.append(
            DeviceInfo(
                name=ffi.string(out.name).decode(),
                description=ffi.string(out.description).decode(),
                type=DEVICE_TYPES.get(out.type, str(out.type)),
                memory_free=out.memory_free,
                memory_total=out.memory_total,
            )
        )
    return result


QSA_MODES = ("positional", "sparse", "masked")  # PYQSA_QSA_* in pyqsa.h, in order


def init_from_model(
    model: int, params_address: int, qsa_mode: str, hot_blocks: int = 0, hot_type: int = -1
) -> int:
    """llama_init_from_model with pyqsa's settings; returns the llama_context pointer.

    model: a llama_model pointer; params_address: the address of a llama_context_params
    (upstream's ctypes struct, `ctypes.addressof`); hot_blocks > 0 pages the QSA layers' K/V,
    hot_type (a ggml type, -1: the cache's own) is the hot cache's type (see
    pyqsa_context_config in pyqsa.h)."""
    if qsa_mode not in QSA_MODES:
        raise ValueError(f"qsa_mode must be one of {', '.join(QSA_MODES)}, got {qsa_mode!r}")
    ffi, lib = _api()
    cfg = ffi.new("pyqsa_context_config *", lib.pyqsa_context_config_default())
    cfg.qsa_mode = QSA_MODES.index(qsa_mode)
    cfg.hot_blocks = hot_blocks
    cfg.hot_type = hot_type
    err = ffi.new("int32_t *")
    ctx = lib.pyqsa_init_from_model(
        ffi.cast("void *", model), ffi.cast("void *", params_address), cfg, err
    )
    if ctx == ffi.NULL:
        raise NativeError(f"pyqsa_init_from_model failed with code {err[0]}")
    return int(ffi.cast("uintptr_t", ctx))


def context_qsa_mode(ctx: int) -> str:
    """The QSA mode a context was created with."""
    ffi, lib = _api()
    out = ffi.new("pyqsa_context_config *")
    _check(lib.pyqsa_context_config_get(ffi.cast("void *", ctx), out), "pyqsa_context_config_get")
    return QSA_MODES[out.qsa_mode]


LEDGER_FIELDS = (
    "weights",
    "kv",
    "indexer",
    "recurrent",
    "compute",
    "hot",
    "staging",
    "tail",
    "pool",
    "stack",
)


def ledger(ctx: int) -> dict[str, int]:
    """Bytes a llama context holds by category, as "device.<field>" and "host.<field>"."""
    ffi, lib = _api()
    device, host = ffi.new("pyqsa_ledger *"), ffi.new("pyqsa_ledger *")
    _check(lib.pyqsa_ledger_get(ffi.cast("void *", ctx), device, host), "pyqsa_ledger_get")
    return {
        f"{where}.{f}": int(getattr(led, f))
        for where, led in (("device", device), ("host", host))
        for f in LEDGER_FIELDS
    }


PAGING_FIELDS = ("hits", "misses", "staged", "bytes_to_device", "bytes_to_host", "hot_blocks")


def paging_stats(ctx: int) -> dict[str, int] | None:
    """A paging context's counters (pyqsa_paging_stats in pyqsa.h); None when it does not page.
    Waits for the device."""
    ffi, lib = _api()
    out = ffi.new("pyqsa_paging_stats *")
    rc = lib.pyqsa_paging_stats_get(ffi.cast("void *", ctx), out)
    if not _supported(rc, "pyqsa_paging_stats_get"):
        return None
    return {f: int(getattr(out, f)) for f in PAGING_FIELDS}


def paging_layers(ctx: int) -> dict[int, tuple[int, int]] | None:
    """Model layer index -> (hits, misses) of each paged layer; None when ctx does not page."""
    ffi, lib = _api()
    il, hits, misses = ffi.new("int32_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    out: dict[int, tuple[int, int]] = {}
    while True:
        rc = lib.pyqsa_paging_layer_get(ffi.cast("void *", ctx), len(out), il, hits, misses)
        if rc == lib.PYQSA_ERR_UNSUPPORTED:
            return None
        if rc == lib.PYQSA_ERR_OUT_OF_RANGE:
            return out
        _check(rc, "pyqsa_paging_layer_get")
        out[int(il[0])] = (int(hits[0]), int(misses[0]))


CUDA_GRAPH_FIELDS = ("direct", "captured", "replayed")


def cuda_graph_counts() -> dict[str, int] | None:
    """How the CUDA backend ran graphs since the process started (pyqsa_cuda_graph_counts_get
    in pyqsa.h): kernel by kernel, captured into a CUDA graph, replayed; None without CUDA."""
    ffi, lib = _api()
    out = ffi.new("uint64_t[3]")
    if not _supported(lib.pyqsa_cuda_graph_counts_get(out), "pyqsa_cuda_graph_counts_get"):
        return None
    return {f: int(out[i]) for i, f in enumerate(CUDA_GRAPH_FIELDS)}


def cuda_stack_reserve(device: int, min_per_thread: int) -> bool:
    """Raise CUDA device `device`'s per-thread stack to at least `min_per_thread` bytes (0: as
    it is) and count it in the ledger's "stack" from now on (pyqsa_cuda_stack_reserve in
    pyqsa.h); False without a CUDA backend."""
    ffi, lib = _api()
    rc = lib.pyqsa_cuda_stack_reserve(device, min_per_thread)
    return _supported(rc, f"pyqsa_cuda_stack_reserve({device})")


class SeqRows:
    """Where a sequence's rows are (pyqsa_seq_rows in pyqsa.h), from a save or opened without a
    head (seq_rows_open): `get` copies a segment on any thread, as long as the sequence's cells
    of those positions are not written meanwhile (it may grow, not be removed, shortened or
    loaded into). `close` frees the handle. A head saved through a stage (`staged`) is whole, and
    its rows may be read, after `fill_head` (any thread), which hands the stage back through
    `release`; `close` drops an unfilled one."""

    def __init__(self, ptr, head: bytes | np.ndarray | None = None) -> None:
        self._ptr = ptr
        self._head = head
        self._stage: SeqStage | None = None
        self._release = None
        self._reader: RowsReader | None = None

    def read_through(self, reader: RowsReader) -> None:
        """`get` copies through `reader` (the thread that calls it is then the reader's)."""
        self._reader = reader

    def staged(self, stage: SeqStage, release) -> None:
        """The head was saved through `stage`, to be given to `release(stage)` once filled."""
        self._stage, self._release = stage, release

    @property
    def head_staged(self) -> bool:
        return self._stage is not None

    def fill_head(self) -> None:
        self._settle(self._head)

    def _settle(self, head: bytes | np.ndarray | None) -> None:
        """Fill `head` from the stage (None: drop what it holds) and hand the stage back."""
        stage, self._stage = self._stage, None
        if stage is not None:
            try:
                stage.fill(head)
            finally:
                self._release(stage)

    def size(self, start: int, end: int) -> int:
        """The bytes of the rows of positions [start, end) (pyqsa_seq_rows_bytes)."""
        ffi, lib = _api()
        if self._ptr is None:
            raise NativeError("pyqsa_seq_rows_bytes on a closed handle")
        out = ffi.new("size_t *")
        _check(lib.pyqsa_seq_rows_bytes(self._ptr, start, end, out), "pyqsa_seq_rows_bytes")
        return int(out[0])

    def get(self, start: int, end: int):
        """The rows of positions [start, end), a numpy uint8 array (pyqsa_seq_rows_get; the GIL
        is let go meanwhile)."""
        import numpy as np

        ffi, lib = _api()
        if self._ptr is None:
            raise NativeError("pyqsa_seq_rows_get on a closed handle")
        out = np.empty(self.size(start, end), np.uint8)  # not zeroed: every byte is written
        reader = self._reader._ptr if self._reader is not None else ffi.NULL
        rc = lib.pyqsa_seq_rows_get(self._ptr, start, end, ffi.from_buffer(out), len(out), reader)
        _check(rc, "pyqsa_seq_rows_get")
        return out

    def close(self) -> None:
        _, lib = _api()
        if self._ptr is not None:
            lib.pyqsa_seq_rows_free(self._ptr)
            self._ptr = None
        self._settle(None)  # a head never filled: what its stage holds is dropped


class RowsReader:
    """Copies of a context's rows on one thread (pyqsa_rows_reader in pyqsa.h): through pinned
    memory on a stream of their own, beside the context's passes. `create` gives None where the
    context has no such device (the CPU, several GPUs): rows are then read at once. `free`
    before the context is freed."""

    def __init__(self, ptr) -> None:
        self._ptr = ptr

    @classmethod
    def create(cls, ctx: int) -> RowsReader | None:
        ffi, lib = _api()
        out = ffi.new("pyqsa_rows_reader **")
        rc = lib.pyqsa_rows_reader_new(ffi.cast("void *", ctx), out)
        return cls(out[0]) if _supported(rc, "pyqsa_rows_reader_new") else None

    def free(self) -> None:
        _, lib = _api()
        if self._ptr is not None:
            lib.pyqsa_rows_reader_free(self._ptr)
            self._ptr = None


class SeqStage:
    """Where a head's recurrent and conv states wait for the host (pyqsa_seq_stage in pyqsa.h):
    one sequence's, in the device's pinned host memory. A seq_state_save with it leaves those
    bytes of the head unwritten until `fill(head)` (any thread) copies them there; one head at a
    time. `free` before the context is freed."""

    def __init__(self, ctx: int) -> None:
        ffi, lib = _api()
        out = ffi.new("pyqsa_seq_stage **")
        _check(lib.pyqsa_seq_stage_new(ffi.cast("void *", ctx), out), "pyqsa_seq_stage_new")
        self._ptr = out[0]

    def fill(self, head: np.ndarray | None) -> None:
        """Complete `head`, the one the last save with this stage returned (None: drop what the
        stage holds); the stage is free again (also when it raises)."""
        ffi, lib = _api()
        if self._ptr is None:
            raise NativeError("pyqsa_seq_stage_fill on a freed stage")
        buf = ffi.NULL if head is None else ffi.from_buffer(head, require_writable=True)
        size = 0 if head is None else len(head)
        _check(lib.pyqsa_seq_stage_fill(self._ptr, buf, size), "pyqsa_seq_stage_fill")

    def free(self) -> None:
        _, lib = _api()
        if self._ptr is not None:
            lib.pyqsa_seq_stage_free(self._ptr)
            self._ptr = None


def seq_state_save(
    ctx: int, seq_id: int, stage: SeqStage | None = None
) -> tuple[np.ndarray, SeqRows]:
    """Sequence `seq_id`'s state (pyqsa_seq_state_save in pyqsa.h): its head (uint8, in the
    native buffer it was written to, freed with the array) and the handle on its rows,
    for seq_state_load into a sequence of a context with the same settings (or
    seq_state_resume). Waits for the device, unless a `stage` queues its reads behind the
    passes; with a `stage`, the head is whole, and the rows may be read, only after
    `stage.fill(head)`."""
    ffi, lib = _api()
    import numpy as np

    ptr, size = ffi.new("void **"), ffi.new("size_t *")
    rows = ffi.new("pyqsa_seq_rows **")
    staged = stage._ptr if stage is not None else ffi.NULL
    rc = lib.pyqsa_seq_state_save(ffi.cast("void *", ctx), seq_id, staged, ptr, size, rows)
    _check(rc, "pyqsa_seq_state_save")
    # the array keeps its buffer object, which keeps the pointer that frees it, alive
    owned = ffi.gc(ptr[0], lib.pyqsa_seq_head_free, size=size[0])
    head = np.frombuffer(ffi.buffer(owned, size[0]), np.uint8)
    return head, SeqRows(rows[0], head)


def seq_rows_open(ctx: int, seq_id: int) -> SeqRows:
    """A handle on sequence `seq_id`'s rows as of now, without a head (pyqsa_seq_rows_open): a
    sequence that grows has its rows copied ahead of its next save. Waits for the device."""
    ffi, lib = _api()
    rows = ffi.new("pyqsa_seq_rows **")
    rc = lib.pyqsa_seq_rows_open(ffi.cast("void *", ctx), seq_id, rows)
    _check(rc, "pyqsa_seq_rows_open")
    return SeqRows(rows[0])


def seq_state_load(
    ctx: int,
    seq_id: int,
    head: bytes | np.ndarray,
    segments: Sequence[tuple[int, int, bytes | np.ndarray]],
) -> None:
    """Replace sequence `seq_id` with a saved state: its head and (start, end, rows) segments
    covering its positions in order; NativeError (the sequence left empty) when it does not
    load."""
    ffi, lib = _api()
    segs = ffi.new("pyqsa_rows_segment[]", max(1, len(segments)))
    keep = []  # the buffers cffi points at, alive until the call returns
    for i, (start, end, data) in enumerate(segments):
        keep.append(ffi.from_buffer(data))
        segs[i].data, segs[i].size, segs[i].start, segs[i].end = keep[-1], len(data), start, end
    rc = lib.pyqsa_seq_state_load(
        ffi.cast("void *", ctx), seq_id, ffi.from_buffer(head), len(head), segs, len(segments)
    )
    _check(rc, "pyqsa_seq_state_load")


def seq_state_resume(ctx: int, seq_id: int, head: bytes | np.ndarray) -> None:
    """Make sequence `seq_id`, which holds the state's rows already (pyqsa_seq_state_resume), the
    state of `head`: later positions dropped, the head loaded; NativeError (the sequence left
    empty) when it does not."""
    ffi, lib = _api()
    rc = lib.pyqsa_seq_state_resume(
        ffi.cast("void *", ctx), seq_id, ffi.from_buffer(head), len(head)
    )
    _check(rc, "pyqsa_seq_state_resume")


@dataclass(frozen=True)
class ImatrixEntry:
    sums: np.ndarray  # float32 [n_mat, n_cols]: per matrix (expert), the squared inputs summed
    counts: np.ndarray  # int64 [n_counts]: the rows summed, per expert for a MUL_MAT_ID


class ImatrixCollector:
    """An importance-matrix collector (pyqsa_imatrix_new): give `callback` and `user_data` to a
    context as its eval callback, decode text, then read `entries()`."""

    def __init__(self) -> None:
        ffi, lib = _api()
        self.ptr = lib.pyqsa_imatrix_new()
        if self.ptr == ffi.NULL:
            raise NativeError("pyqsa_imatrix_new: out of memory")
        self.callback = int(ffi.cast("uintptr_t", lib.pyqsa_imatrix_collect))
        self.user_data = int(ffi.cast("uintptr_t", self.ptr))

    def error(self) -> str | None:
        ffi, lib = _api()
        buf = ffi.new("char[]", 512)
        return ffi.string(buf).decode() if lib.pyqsa_imatrix_error(self.ptr, buf, 512) > 0 else None

    def entries(self) -> dict[str, ImatrixEntry]:
        import numpy as np

        ffi, lib = _api()
        name = ffi.new("char[]", 256)
        cols, mats, ncounts = ffi.new("int64_t *"), ffi.new("int64_t *"), ffi.new("int64_t *")
        out = {}
        for i in range(lib.pyqsa_imatrix_n_entries(self.ptr)):
            _check(lib.pyqsa_imatrix_entry(self.ptr, i, name, 256, cols, mats, ncounts), "entry")
            sums = np.empty((mats[0], cols[0]), dtype=np.float32)
            counts = np.empty(ncounts[0], dtype=np.int64)
            rc = lib.pyqsa_imatrix_read(
                self.ptr,
                i,
                ffi.cast("float *", sums.ctypes.data),
                ffi.cast("int64_t *", counts.ctypes.data),
            )
            _check(rc, "pyqsa_imatrix_read")
            out[ffi.string(name).decode()] = ImatrixEntry(sums, counts)
        return out

    def free(self) -> None:
        _, lib = _api()
        if self.ptr is not None:
            lib.pyqsa_imatrix_free(self.ptr)
            self.ptr = None


def abort_flag_callback() -> int:
    """Address of pyqsa_abort_flag_is_set, an abort callback for llama_set_abort_callback."""
    ffi, lib = _api()
    return int(ffi.cast("uintptr_t", lib.pyqsa_abort_flag_is_set))


def take_error() -> str | None:
    """The calling thread's last error from pyqsa's code inside llama_decode, once; None if none."""
    ffi, lib = _api()
    buf = ffi.new("char[]", 1024)
    n = lib.pyqsa_last_error(buf, len(buf))
    return ffi.string(buf).decode("utf-8", errors="replace") if n > 0 else None


@dataclass(frozen=True)
class SampleResult:
    token: int
    logprob: float  # NaN when no log-probabilities were asked for
    top: tuple[tuple[int, float], ...]


def _sample_params(
    ffi,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 0,
    counter: int = 0,
    n_top: int = -1,
):
    """A pyqsa_sample_params (pyqsa.h): any integer seed (its low 64 bits), any top_k >= 0 (past
    int32 it is past every vocabulary: no cut, as 0); n_top -1 asks for no log-probabilities."""
    p = ffi.new("pyqsa_sample_params *")
    p.temperature, p.top_k, p.top_p, p.min_p = temperature, min(top_k, 2**31 - 1), top_p, min_p
    seed %= 2**64
    p.seed_lo, p.seed_hi, p.counter, p.n_top = seed & 0xFFFFFFFF, seed >> 32, counter % 2**32, n_top
    return p


def _sample_result(out, n_top: int) -> SampleResult:
    top = tuple(
        (int(out.top_ids[j]), float(out.top_logprobs[j]))
        for j in range(max(n_top, 0))
        if out.top_ids[j] >= 0  # -1 past a row shorter than n_top
    )
    return SampleResult(int(out.token), float(out.logprob), top)


def _adjust_list(ffi, adjust):
    """(pointer, count, owner) of a pyqsa_logit_adjust list: `adjust` int32 [n, 4] rows (the
    float fields by their bits, see pyqsa.engine.sampler), or None for none."""
    import numpy as np

    if adjust is None or len(adjust) == 0:
        return ffi.NULL, 0, None
    a = np.ascontiguousarray(adjust, dtype=np.int32)
    if a.ndim != 2 or a.shape[1] != 4:
        raise ValueError(f"logit adjustments: expected int32 rows of 4 words, got shape {a.shape}")
    return ffi.cast("const pyqsa_logit_adjust *", a.ctypes.data), a.shape[0], a


def sample(logits, adjust=None, **draw) -> SampleResult:
    """One row drawn by the native host sampler (pyqsa_sample: the sample op's CPU kernel);
    `logits` a float32 numpy row, `adjust` its logit adjustments (_adjust_list), `draw` the
    keywords of _sample_params."""
    import numpy as np

    ffi, lib = _api()
    x = np.ascontiguousarray(logits, dtype=np.float32)
    p = _sample_params(ffi, **draw)
    ptr, n, _owner = _adjust_list(ffi, adjust)
    out = ffi.new("pyqsa_sample_result *")
    rc = lib.pyqsa_sample(ffi.cast("const float *", x.ctypes.data), x.size, p, ptr, n, out)
    _check(rc, "pyqsa_sample")
    return _sample_result(out, p.n_top)


class DeviceSampler:
    """A sampler chain that draws one sequence's tokens inside llama_decode (pyqsa_sampler_new),
    taking up to `max_adjust` logit adjustments a draw: set the next draw's parameters, attach
    it to the sequence, read the result by output."""

    def __init__(self, max_adjust: int = 0) -> None:
        ffi, lib = _api()
        self.ptr = lib.pyqsa_sampler_new(max_adjust)
        if self.ptr == ffi.NULL:
            raise NativeError(f"pyqsa_sampler_new: max_adjust {max_adjust} outside 0..65536")
        self.max_adjust = max_adjust
        self.n_top = -1

    def set(self, adjust=None, **draw) -> None:
        """The next draw's parameters (the keywords of _sample_params) and logit adjustments
        (_adjust_list)."""
        ffi, lib = _api()
        p = _sample_params(ffi, **draw)
        ptr, n, _owner = _adjust_list(ffi, adjust)
        _check(lib.pyqsa_sampler_set(self.ptr, p, ptr, n), "pyqsa_sampler_set")
        self.n_top = p.n_top

    def free(self) -> None:
        _, lib = _api()
        if self.ptr is not None:
            lib.pyqsa_sampler_free(self.ptr)
            self.ptr = None


def sampler_attach(ctx: int, seq_id: int, sampler: DeviceSampler | None) -> None:
    """Attach `sampler` to sequence `seq_id` of llama context `ctx`, or detach with None."""
    ffi, lib = _api()
    ptr = ffi.NULL if sampler is None else sampler.ptr
    _check(lib.pyqsa_sampler_attach(ffi.cast("void *", ctx), seq_id, ptr), "pyqsa_sampler_attach")


def sampled_get(ctx: int, i: int, n_top: int) -> SampleResult:
    """The draw of output i of the last decode, made by an attached DeviceSampler."""
    ffi, lib = _api()
    out = ffi.new("pyqsa_sample_result *")
    _check(lib.pyqsa_sampled_get(ffi.cast("void *", ctx), i, out), "pyqsa_sampled_get")
    return _sample_result(out, n_top)


def raw():
    """(ffi, lib) for callers that need the raw cffi objects (tests of return codes)."""
    return _api()
