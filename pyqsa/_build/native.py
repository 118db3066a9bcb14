"""Build the patched upstream + native/ with CMake and stage the Python-facing outputs.

Outputs (all under .build/, git-ignored):
  .build/upstream/<sdist>/   pristine, verified extract (cache)
  .build/llama.cpp/          patched tree (git repo, see patches.py)
  .build/cmake-<variant>/    CMake build folder (incremental)
  .build/py/llama_cpp/       upstream's ctypes bindings, with lib/ holding our shared libraries
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import patches, upstream

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / ".build"
PY_OUT = BUILD / "py"
DEFAULT_TARGETS = [
    "llama",
    "ggml",
    "test-qsa-ops",
    "test-qsa-page",
    "test-sample",
    "test-products",
    "test-gdn",
    "test-fused",
    "test-input-stage",
]
PYTHON_LOADED = ["libllama.so", "libggml.so"]


@dataclass(frozen=True)
class BuildConfig:
    cuda: bool
    cuda_archs: str
    extra_targets: tuple[str, ...]
    jobs: int

    @classmethod
    def from_env(cls) -> BuildConfig:
        return cls(
            cuda=os.environ.get("PYQSA_CUDA", "0") not in ("", "0", "off", "OFF"),
            cuda_archs=os.environ.get("PYQSA_CUDA_ARCHS", "90a"),
            extra_targets=tuple(os.environ.get("PYQSA_EXTRA_TARGETS", "").split()),
            jobs=int(os.environ.get("PYQSA_BUILD_JOBS", os.cpu_count() or 2)),
        )

    @property
    def variant(self) -> str:
        return "cuda" if self.cuda else "cpu"

    @property
    def build_dir(self) -> Path:
        return BUILD / f"cmake-{self.variant}"


def pyqsa_version() -> str:
    for line in (ROOT / "pyqsa" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("pyqsa/__init__.py has no __version__")


def _run(cmd: list[str], **kw) -> None:
    print("pyqsa:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def configure(cfg: BuildConfig, src: Path) -> None:
    up = upstream.read_upstream()
    args = [
        "cmake",
        "-S",
        str(src),
        "-B",
        str(cfg.build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DLLAMA_BUILD_COMMON=ON",
        "-DLLAMA_BUILD_TESTS=ON",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        f"-DLLAMA_BUILD_COMMIT={up.llama_cpp_commit}",
        f"-DPYQSA_NATIVE_DIR={ROOT / 'native'}",
        f"-DPYQSA_VERSION={pyqsa_version()}",
        f"-DPYQSA_UPSTREAM_COMMIT={up.llama_cpp_commit}",
        f"-DGGML_CUDA={'ON' if cfg.cuda else 'OFF'}",
    ]
    if cfg.cuda:
        args.append(f"-DCMAKE_CUDA_ARCHITECTURES={cfg.cuda_archs}")
    # NOTE: upstream's AMX matrix products (ggml-cpu/amx, compiled where -march=native has AMX:
    # Xeons since Sapphire Rapids) crash on k-quant weights: a Q4_K_M file segfaulted in
    # ggml_backend_amx_mul_mat at its first pass (ggml-org/llama.cpp#20824, open). The CPU
    # backend is built without them; its AVX-512 kernels take those products.
    if platform.machine().lower() in ("x86_64", "amd64"):
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        for lang, env in (("C", "CFLAGS"), ("CXX", "CXXFLAGS")):
            flags = f"{os.environ.get(env, '')} {no_amx}".strip()
            args.append(f"-DCMAKE_{lang}_FLAGS={flags}")
    # where the toolkit is not in one place (tests/gpu/prebuild.sh: cuBLAS from its wheel, a
    # stand-in driver library for the link)
    try:
        args += shlex.split(os.environ.get("PYQSA_CMAKE_ARGS", ""))
    except ValueError as e:  # an unclosed quote: one line, not a traceback out of pip
        raise SystemExit(f"PYQSA_CMAKE_ARGS: {e}") from None
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    cache = cfg.build_dir / "CMakeCache.txt"
    if cache.exists() and ("Ninja" in cache.read_text()) != bool(shutil.which("ninja")):
        shutil.rmtree(cfg.build_dir)
    _run(args)


def stage_bindings() -> Path:
    """Copy upstream's llama_cpp package to .build/py (fetching upstream if needed).

    setup.py calls this before setup(): setuptools wants every package folder to exist already
    when it writes metadata, long before build_py compiles anything.
    """
    extract = upstream.fetch()
    dst = PY_OUT / "llama_cpp"
    stamp = (extract / ".pyqsa-sha256").read_text()
    if not (dst / ".pyqsa-sha256").exists() or (dst / ".pyqsa-sha256").read_text() != stamp:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(
            extract / "llama_cpp",
            dst,
            ignore=shutil.ignore_patterns("server", "__pycache__", "lib"),
        )
        (dst / ".pyqsa-sha256").write_text(stamp)
    return dst


def stage_libraries(cfg: BuildConfig) -> Path:
    """Put the built shared libraries (and pyqsa.h) into the staged llama_cpp/lib."""
    lib = stage_bindings() / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir()
    # The dynamic linker wants the SONAME files (libggml.so.0, ...; found through RPATH $ORIGIN);
    # Python loads libllama.so and libggml.so by their plain names. Wheels cannot hold symlinks.
    bin_dir = cfg.build_dir / "bin"
    for so in sorted(bin_dir.glob("lib*.so.0")):
        shutil.copy2(so, lib / so.name)
    for name in PYTHON_LOADED:
        shutil.copy2(bin_dir / name, lib / name)
    # The header travels with the library: pyqsa/native.py reads its declarations for cffi.
    shutil.copy2(ROOT / "native" / "include" / "pyqsa.h", lib / "pyqsa.h")
    (lib / "VARIANT").write_text(cfg.variant + "\n")
    return lib


def build(cfg: BuildConfig | None = None) -> Path:
    """Fetch, patch, configure and build; return the staged llama_cpp/lib folder."""
    cfg = cfg or BuildConfig.from_env()
    if os.environ.get("PYQSA_PREBUILT") == "1":
        # tests/gpu/prebuilt.sh unpacked a build made elsewhere (tests/gpu/prebuild.sh) into
        # cfg.build_dir/bin: only staged, so pip's editable install takes seconds, not a build
        return stage_libraries(cfg)
    extract = upstream.fetch()
    tree = BUILD / "llama.cpp"
    patches.init_tree(extract / "vendor" / "llama.cpp", tree)
    patches.apply_series(tree)
    configure(cfg, tree)
    targets = DEFAULT_TARGETS + list(cfg.extra_targets)
    _run(["cmake", "--build", str(cfg.build_dir), "-j", str(cfg.jobs), "--target", *targets])
    return stage_libraries(cfg)
