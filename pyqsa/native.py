"""Bindings: pyqsa's own C API through cffi, upstream's through llama-cpp-python's ctypes.

Both live in the same patched libllama, staged in the installed `llama_cpp/lib` folder.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import cffi

DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "ACCEL"}


class NativeError(RuntimeError):
    """A pyqsa_* call returned an error code."""


def lib_dir() -> Path:
    """The folder holding the patched shared libraries and pyqsa.h."""
    import importlib.util

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


def abort_flag_callback() -> int:
    """Address of pyqsa_abort_flag_is_set, an abort callback for llama_set_abort_callback."""
    ffi, lib = _api()
    return int(ffi.cast("uintptr_t", lib.pyqsa_abort_flag_is_set))


def raw():
    """(ffi, lib) for callers that need the raw cffi objects (tests of return codes)."""
    return _api()
