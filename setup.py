"""Build pyqsa: fetch the pinned upstream, apply ggml_patches/, build it with native/, install.

PYQSA_CUDA=1 builds the CUDA variant (PYQSA_CUDA_ARCHS, default 90a); PYQSA_EXTRA_TARGETS adds
CMake targets (e.g. test-backend-ops). Rebuilds reuse .build/ and are incremental.
"""

import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from pyqsa._build import native  # noqa: E402

# NOTE: setuptools checks every package folder while writing metadata, so the llama_cpp
# bindings are staged first. The native build runs for any command that produces an install
# (pip's wheel and editable paths, legacy develop): hooking build_py alone misses `develop`,
# and editable_wheel skips build_py's body.
native.stage_bindings()
if {"build", "build_py", "bdist_wheel", "editable_wheel", "develop", "install"} & set(sys.argv):
    native.build()

setup(
    package_dir={
        "pyqsa": "pyqsa",
        "pyqsa.convert": "convert",
        "pyqsa.server": "server",
        "llama_cpp": ".build/py/llama_cpp",
    },
    packages=[
        "pyqsa",
        "pyqsa._build",
        "pyqsa.bench",
        "pyqsa.bench.scenarios",
        "pyqsa.engine",
        "pyqsa.convert",
        "pyqsa.server",
        "llama_cpp",
    ],
    package_data={"llama_cpp": ["lib/*", "py.typed"]},
)
