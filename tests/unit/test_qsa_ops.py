"""The native ggml ops against their double-precision reference (native/tests/test-qsa-ops.cpp).

On a CPU-only machine this checks the CPU kernels; on the GPU machine the same binary also
checks CUDA against CPU (tests/gpu/backend_ops.sh)."""

import re
import subprocess

from pyqsa._build.native import BuildConfig


def test_qsa_ops_match_reference():
    binary = BuildConfig.from_env().build_dir / "bin" / "test-qsa-ops"
    assert binary.exists(), f"{binary} missing: the build did not make test-qsa-ops"
    proc = subprocess.run([str(binary), "test"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    m = re.search(r"(\d+)/(\d+) checks passed", proc.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 20, proc.stdout[-2000:]


def test_page_resolve_matches_its_model():
    binary = BuildConfig.from_env().build_dir / "bin" / "test-qsa-page"
    assert binary.exists(), f"{binary} missing: the build did not make test-qsa-page"
    proc = subprocess.run([str(binary), "test"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    m = re.search(r"(\d+)/(\d+) checks passed", proc.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 4, proc.stdout[-2000:]
