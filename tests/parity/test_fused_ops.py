"""pyqsa's fused ops in the qwen4exp graph give the bits of the ops they replace: the tiny model's
logits of a prompt and of decode steps with the fused hyper-connection ops (the default) and with
PYQSA_HC_UNFUSED=1 (upstream's ops), each in a process of its own (the switch is read once), and
the graph of the first has three nodes fewer a combine and one fewer a mix's gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

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
combines = sum(n.startswith("hc_inject-") for n in nodes)  # a combine's weights, each
mixes = sum(re.fullmatch(r"hc_gate(-\d+)?", n) is not None for n in nodes)  # the output's too
print(json.dumps({"step_nodes": len(nodes) // 8, "combines": combines // 8, "mixes": mixes // 8}))
"""


def _run(gguf: Path, out: Path, unfused: bool) -> tuple[np.ndarray, dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYQSA_HC_UNFUSED"}
    if unfused:
        env["PYQSA_HC_UNFUSED"] = "1"
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


def test_the_fused_combine_gives_the_bits_of_upstreams_ops(tiny_gguf, tmp_path):
    fused, f = _run(tiny_gguf, tmp_path / "fused.npy", unfused=False)
    plain, u = _run(tiny_gguf, tmp_path / "plain.npy", unfused=True)
    assert fused.shape == plain.shape and np.isfinite(fused).all()
    assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32))
    assert (
        f["combines"] > 0
        and f["mixes"] >= f["combines"]
        and (f["combines"], f["mixes"])
        == (
            u["combines"],
            u["mixes"],
        )
    )
    assert u["step_nodes"] - f["step_nodes"] == 3 * f["combines"] + f["mixes"], (f, u)
