"""Build pyqsa: fetch the pinned upstream, apply ggml_patches/, build it with native/, install.

PYQSA_CUDA=1 builds the CUDA variant (PYQSA_CUDA_ARCHS, default 90a); PYQSA_EXTRA_TARGETS adds
CMake targets (e.g. test-backend-ops). Rebuilds reuse .build/ and are incremental.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from pyqsa._build import native  # noqa: E402

native.stage_bindings()


class BuildWithNative(build_py):
    def run(self):
        native.build()
        super().run()


setup(
    cmdclass={"build_py": BuildWithNative},
    package_dir={
        "pyqsa": "pyqsa",
        "pyqsa.convert": "convert",
        "pyqsa.server": "server",
        "llama_cpp": ".build/py/llama_cpp",
    },
    packages=["pyqsa", "pyqsa._build", "pyqsa.engine", "pyqsa.convert", "pyqsa.server",
              "llama_cpp"],
    package_data={"llama_cpp": ["lib/*", "py.typed"]},
)
