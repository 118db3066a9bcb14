"""What a benchmark record says about its run: commits, library, flags' context, GPU."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout (git, UPSTREAM, bench/results)
RESULTS = ROOT / "bench" / "results"  # the recorded result files


def _cmd(*cmd: str) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> dict[str, Any]:
    """The commit measured and whether tracked files differ from it (a dirty tree is not that
    commit's code).

    The launcher's PYQSA_BENCH_COMMIT wins: the device machine's copy of the tree carries a git
    folder whose HEAD is not the commit sent (seen there: an older one, "dirty"), so there the
    commit is the one named and whether the tree matches it is left to source_digest.
    """
    named = os.environ.get("PYQSA_BENCH_COMMIT")
    if named:
        return {"commit": named, "dirty": None}
    head = _cmd("git", "rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None}
    status = _cmd("git", "status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "dirty": bool(status)}


def source_digest() -> str:
    """sha256 over what decides the measured code (patches, native code, build, benchmarks):
    ties a record to a tree whose git state is unknown or dirty."""
    h = hashlib.sha256()
    for d in ("ggml_patches", "native", "pyqsa/_build", "pyqsa/bench", "bench"):
        for f in sorted((ROOT / d).rglob("*")):
            if f.is_file() and not {"__pycache__", "results"} & set(f.parts):
                h.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def upstream_commit() -> str | None:
    path = ROOT / "UPSTREAM"
    if not path.exists():  # an installed package, not a checkout
        return None
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "llama_cpp_commit":
            return value.strip()
    return None


def gpu_name() -> str | None:
    out = _cmd("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
    return out.splitlines()[0].strip() if out else None


def library(L: Any, expect: str) -> dict[str, Any]:
    """The loaded libllama: pyqsa's exports pyqsa_version, an unpatched upstream does not."""
    lib = L.llama_cpp._lib
    found = "pyqsa" if hasattr(lib, "pyqsa_version") else "upstream"
    if found != expect:
        raise SystemExit(f"--variant {expect}, but {lib._name} is a {found} build")
    info: dict[str, Any] = {"variant": found, "lib": str(Path(lib._name).resolve())}
    if found == "pyqsa":
        lib.pyqsa_version.restype = ctypes.c_char_p
        info["pyqsa_version"] = lib.pyqsa_version().decode()
    return info


def run_meta(L: Any, variant: str, lib_dir: Path | None, model: Path) -> dict[str, Any]:
    return {
        **git_commit(),
        "source_digest": source_digest(),
        "upstream_commit": upstream_commit(),
        **library(L, variant),
        "gpu": gpu_name(),
        "system_info": L.llama_print_system_info().decode(errors="replace").strip(),
        "model": model.name,
        "model_bytes": model.stat().st_size,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
