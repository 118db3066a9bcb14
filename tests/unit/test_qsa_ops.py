"""The native ggml ops against their references: test-qsa-ops (each op against a
double-precision reference, native/tests/test-qsa-ops.cpp) and test-qsa-page (the paging op
against a sequential LRU model over multi-step scenarios, native/tests/test-qsa-page.cpp) and
test-sample (the sample op against a brute-force reference of its rules,
native/tests/test-sample.cpp) and test-products (upstream's MUL_MAT and MUL_MAT_ID, whose
CUDA dispatch and precision pyqsa changes, and products of one x with other ops between them
run through a scheduler, which the CUDA backend groups into one launch, against a
double-precision reference, native/tests/test-products.cpp) and test-gdn (upstream's
GATED_DELTA_NET, whose prefill pyqsa runs on its own CUDA kernel, against a double-precision
recurrence, native/tests/test-gdn.cpp) and test-fused (qwen4exp's fused ops: the hyper-connection
combine and gate, the linear attention's gates, convolution step and gated norm, and the shared
expert's gated join, against the
graphs of upstream's ops they replace, bit for bit, native/tests/test-fused.cpp) and
test-input-stage (the scheduler's queued copies of host inputs, patch 0028, and a snapshot head's
queued reads of the states, native/src/seq-stage.h, on a stand-in backend whose copies land only
when waited for, native/tests/test-input-stage.cpp).

On a CPU-only machine this checks the CPU kernels; on the GPU machine the same binaries also
check CUDA against CPU (tests/gpu/backend_ops.sh)."""

import re
import subprocess

import pytest

from pyqsa._build.native import BuildConfig


@pytest.mark.parametrize(
    "binary,min_checks",
    [
        ("test-qsa-ops", 20),
        ("test-qsa-page", 7),
        ("test-sample", 14),
        ("test-products", 42),
        ("test-gdn", 9),
        ("test-fused", 29),
        ("test-input-stage", 6),
    ],
)
def test_ops_match_their_references(binary, min_checks):
    path = BuildConfig.from_env().build_dir / "bin" / binary
    assert path.exists(), f"{path} missing: the build did not make {binary}"
    proc = subprocess.run([str(path), "test"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    m = re.search(r"(\d+)/(\d+) checks passed", proc.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= min_checks, proc.stdout[-2000:]
