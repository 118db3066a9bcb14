"""pyqsa's fused ops in the qwen4exp graph give the bits of the ops they replace: the tiny model's
logits of a prompt and of decode steps with the fused ops (the default) and with one switch set
(upstream's ops), each in a process of its own (the switches are read once), and the graph of the
first has the nodes fewer that each fusion takes away: PYQSA_HC_UNFUSED=1, three a combine, one
a mix's gate and one a shared expert's join (inside the combine after it); PYQSA_GATES_UNFUSED=1,
twelve a linear-attention layer's decode step (two of its gates, one of its q and k norms, six of
its convolution: concat, convolution, SiLU and the state's store as one op, three of its output's
gated norm) and three a shared expert's join (sigmoid, mul and add, inside the combine), and where a
decode step finds the sequence's states in its cell (every step here) another twelve a
linear-attention layer (its two states read in place: build_rs's gathers, the views and the
zero-sized copies around them, seven nodes each, for a view each) and two a step (the views of
s_copy that the gathers read); PYQSA_HC_JOIN_UNFUSED=1, one a shared expert's join (the join's
own op). The prompt's logits cover the prefill's convolution, whose state's
store copies the strided tail without a cont first. A decode step's mixes of hyper-connections run
as two ops only on a GPU (their test is below)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# The CPU backend's graph, node counts and bits: where tests/gpu/parity.sh runs this directory
# with the layers on a GPU, the mixes fuse there and the CUDA ops round otherwise; on a GPU the
# same checks are test-fused's and tests/gpu/fast_path.py's (bench/gpu_run.sh --op-checks)
pytestmark = pytest.mark.skipif(
    int(os.environ.get("PYQSA_TEST_N_GPU_LAYERS", "0")) > 0,
    reason="the CPU backend's fusions (on a GPU: test-fused and tests/gpu/fast_path.py)",
)
SWITCHES = ("PYQSA_HC_UNFUSED", "PYQSA_GATES_UNFUSED", "PYQSA_HC_JOIN_UNFUSED")
MIX_SWITCHES = ("PYQSA_HC_MIX_ANY_BACKEND", "PYQSA_HC_MIX_UNFUSED")

RUN = r"""
import json, re, sys
import numpy as np
from tests.parity.compare import tokens
from tests.parity.llama_runtime import LlamaRuntime

nodes = []
rt = LlamaRuntime(sys.argv[1], n_ctx=256, n_batch=256, on_node=nodes.append)
toks = tokens(72, seed=11)
rows = [rt.decode([(0, toks[:64], 0)])[0]]
nodes.clear()
for p in range(64, 72):  # decode steps
    rows.append(rt.decode([(0, [toks[p]], p)])[0])
rt.close()
np.save(sys.argv[2], np.concatenate(rows))

def per_step(pattern):
    return sum(re.fullmatch(pattern, n) is not None for n in nodes) // 8

print(json.dumps({
    "step_nodes": len(nodes) // 8,
    "combines": per_step(r"hc_inject-\d+"),  # a combine's weights, each
    "mixes": per_step(r"hc_gate(-\d+)?"),  # the output's too (mixes of upstream's ops)
    "fused_mixes": per_step(r"hc_down-\d+"),
    "linear_layers": per_step(r"conv_output_silu-\d+"),
    "shared_experts": per_step(r"shared_expert_gate-\d+"),
}))
"""


def _run(gguf: Path, out: Path, *switches: str) -> tuple[np.ndarray, dict]:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES + MIX_SWITCHES}
    env |= dict.fromkeys(switches, "1")
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(gguf), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out), json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fused_run(tiny_gguf, tmp_path_factory):
    return _run(tiny_gguf, tmp_path_factory.mktemp("fused") / "fused.npy")


@pytest.mark.parametrize("switch", SWITCHES)
def test_each_fusion_gives_the_bits_of_upstreams_ops(tiny_gguf, tmp_path, fused_run, switch):
    fused, f = fused_run
    plain, u = _run(tiny_gguf, tmp_path / "plain.npy", switch)
    assert fused.shape == plain.shape and np.isfinite(fused).all()
    assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32))
    shape = ("combines", "mixes", "linear_layers", "shared_experts")
    assert {k: f[k] for k in shape} == {k: u[k] for k in shape}
    # on the CPU a decode step's mixes stay upstream's ops (see the next test)
    assert f["combines"] > 0 and f["fused_mixes"] == 0 and f["mixes"] == f["combines"] + 1
    assert f["linear_layers"] > 0 and f["shared_experts"] > 0
    fewer = {
        "PYQSA_HC_UNFUSED": 3 * f["combines"] + f["mixes"] + f["shared_experts"],
        "PYQSA_GATES_UNFUSED": 24 * f["linear_layers"] + 3 * f["shared_experts"] + 2,
        "PYQSA_HC_JOIN_UNFUSED": f["shared_experts"],
    }[switch]
    assert u["step_nodes"] - f["step_nodes"] == fewer, (f, u)


def test_fused_mix_agrees_with_upstreams_ops_to_rounding(tiny_gguf, tmp_path, fused_run):
    """A decode step's mixes of hyper-connections as two ops: fused only where the weights live
    on a GPU (on the CPU, which runs the default above, upstream's products round a row alike in
    any batch, and the prefix cache's follow-ups stay exact), and here on the CPU with
    PYQSA_HC_MIX_ANY_BACKEND=1: the prompt (64 tokens; the fused mix takes one) keeps its bits;
    the decode steps agree with PYQSA_HC_MIX_UNFUSED=1's to f32 rounding (the products' sums in
    another order; the same bits where the CPU's kernels sum both in one order, as seen on an
    AVX-512 Xeon), and each fused mix takes seven nodes fewer (rms_norm, mul, the products
    down, up and inject, the gate, the streams' mean and two reshapes, ten, for the two ops and
    the view of the scatter logits)."""
    default, d = fused_run
    fused, f = _run(tiny_gguf, tmp_path / "fused.npy", "PYQSA_HC_MIX_ANY_BACKEND")
    plain, u = _run(tiny_gguf, tmp_path / "plain.npy", *MIX_SWITCHES)
    assert np.array_equal(default.view(np.uint32), plain.view(np.uint32)) and d == u
    assert fused.shape == plain.shape and np.isfinite(fused).all()
    assert np.array_equal(fused[0].view(np.uint32), plain[0].view(np.uint32))
    scale = np.abs(plain[1:]).max()
    assert np.abs(fused[1:] - plain[1:]).max() <= 1e-5 * scale
    assert f["fused_mixes"] == f["combines"] > 0 and f["mixes"] == 1  # the output's mix: no inject
    assert u["fused_mixes"] == 0 and u["mixes"] == f["fused_mixes"] + f["mixes"]
    assert u["step_nodes"] - f["step_nodes"] == 7 * f["fused_mixes"], (f, u)


def test_greedy_outputs_of_eight_slots_through_the_engine_keep_their_bits_unfused():
    """tests/gpu/fast_path.py as the GPU machine runs it (256 steps there), on the CPU: the
    demo model's greedy tokens and log-probabilities of 8 requests at once through the engine,
    fused and unfused, bit for bit (its exit status), and the runs' report."""
    proc = subprocess.run(
        [sys.executable, "tests/gpu/fast_path.py", "--steps", "16", "--gpu-layers", "0"]
        + ["--slots", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6 and "[16, 16, 16, 16, 16, 16, 16, 16] tokens each" in lines[0]
    assert "vs unfused" in lines[0] and "identical True" in lines[0] and lines[0].endswith("OK")
    # the combine inside the mix's first kernel and the gates inside the convolution's are CUDA's
    # launches, and the CPU backend queues no input copies: on the CPU their switches change
    # nothing
    labels = ("vs combine apart", "vs gates apart", "vs inputs copied with waits")
    for line, label in zip(lines[1:4], labels, strict=True):
        assert label in line and "identical True" in line and line.endswith("OK")


def test_the_two_gpu_check_needs_two_gpus():
    """tests/gpu/two_gpus.py (fast_path.py's runs with --gpus 0 against --gpus 0,1) says so
    and exits 2 where fewer than two GPUs are seen, as on this CPU build."""
    proc = subprocess.run(
        [sys.executable, "tests/gpu/two_gpus.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "two_gpus.py: 0 GPU(s) here, two needed"
