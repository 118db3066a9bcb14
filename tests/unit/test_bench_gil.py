"""The server's host-side measurements on the CPU: bench/cuda_calls.c's waits for the GIL, in
bench/host_split.py's `engine` window and in bench/serve_sim.py's stand-in of a GPU step."""

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from bench_scripts import BENCH

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the shim is built with gcc")
# the shim sees the GIL taken back only through a shared libpython's exported symbol
SHARED = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))


def test_host_split_engine_window(tmp_path):
    from pyqsa.demo_model import demo_model_path

    model = str(demo_model_path(tmp_path))
    args = [str(BENCH / "host_split.py"), "engine", model, "--prompt-tokens", "64"]
    proc = subprocess.run(
        [sys.executable, *args, "--", "--threads", "1"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert '"together_tok_s"' in out
    assert "## engine --threads 1: " in out and "per step wall " in out
    if SHARED:
        assert "(pyqsa-engine): GIL_wait " in out, out


def test_serve_sim_bare(tmp_path):
    shim = tmp_path / "cuda_calls.so"
    build = ["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(BENCH / "cuda_calls.c")]
    subprocess.run([*build, "-ldl", "-lpthread"], check=True)
    env = {**os.environ, "PYQSA_CACHE_DIR": str(tmp_path / "cache"), "LD_PRELOAD": str(shim)}
    args = [str(BENCH / "serve_sim.py"), "--bare", "--forward-ms", "3", "--max-tokens", "270"]
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert " steps of 8 decode tokens: wall " in proc.stdout
    if SHARED:
        assert "pyqsa-engine: GIL_wait " in proc.stdout, proc.stdout
