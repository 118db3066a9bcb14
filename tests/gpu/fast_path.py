"""Greedy outputs with the decode fast path on and off: the same requests through the engine
(load_engine, so the warm-up and, on CUDA, the captured graphs run as they do when serving), 1
and 8 slots at once, each setting in a process of its own (the library reads its switches once).

The fused graph ops keep upstream's bits by construction (native/src/fused-ops.h), so their runs
must give the same tokens and log-probabilities, bit for bit: PYQSA_HC_UNFUSED=1 and
PYQSA_GATES_UNFUSED=1 together against the default; so must a combine of hyper-connections run
inside the next mix's first kernel (PYQSA_CUDA_HC_COMBINE_APART=1 runs it apart, with the same
expressions), and a decode step's linear-attention gates inside its convolution's launch
(PYQSA_CUDA_GDN_CONV_APART=1 runs them apart, likewise), and a step's host inputs copied from
the scheduler's pinned stage, queued on the stream (PYQSA_SCHED_INPUTS_SYNC=1 copies each with
upstream's waits: the same bytes arrive before the same graph). The grouped products
(PYQSA_CUDA_PRODUCTS_UNGROUPED=1) change the sums of the narrow products that went to upstream's
f16-summed kernel alone, and a decode step's mixes of hyper-connections as two ops
(PYQSA_HC_MIX_UNFUSED=1 keeps upstream's) sum their products in another order, so those runs are
reported, not gated: the share of equal tokens and the first step where they part.

    python tests/gpu/fast_path.py [MODEL] [--steps 256] [--gpu-layers 999]
        (default MODEL: the embedded demo; exit status 1 when a gated run differs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNFUSED = {"PYQSA_HC_UNFUSED": "1", "PYQSA_GATES_UNFUSED": "1"}
UNGROUPED = {"PYQSA_CUDA_PRODUCTS_UNGROUPED": "1"}
MIX_UNFUSED = {"PYQSA_HC_MIX_UNFUSED": "1"}
COMBINE_APART = {"PYQSA_CUDA_HC_COMBINE_APART": "1"}
GATES_APART = {"PYQSA_CUDA_GDN_CONV_APART": "1"}
INPUTS_SYNC = {"PYQSA_SCHED_INPUTS_SYNC": "1"}
SWITCHES = (*UNFUSED, *UNGROUPED, *MIX_UNFUSED, *COMBINE_APART, *GATES_APART, *INPUTS_SYNC)


def prompts(n: int) -> list[list[int]]:
    """n prompts of different lengths and tokens (ids within any vocabulary of 3000+)."""
    return [[(31 * i + 17 * k) % 2900 + 60 for i in range(40 + 23 * k)] for k in range(n)]


def generate(
    model: str, n_slots: int, steps: int, gpu_layers: int, overrides: dict | None = None
) -> list[dict]:
    """Each request's tokens and log-probabilities (as float32 bit patterns) from one engine;
    `overrides`: more EngineConfig fields (lists for tuples, as JSON gives them)."""
    import numpy as np

    from pyqsa.engine import EngineConfig, SamplingParams, load_engine
    from pyqsa.engine.request import Delta
    from tests.unit.engine_fakes import Collector

    config = EngineConfig(
        model,
        n_slots=n_slots,
        ctx_per_slot=512 + steps,
        max_batch_tokens=256,
        gpu_layers=gpu_layers,
        **{k: tuple(v) if isinstance(v, list) else v for k, v in (overrides or {}).items()},
    )
    engine, _ = load_engine(config)
    try:
        sinks = [Collector() for _ in range(n_slots)]
        for prompt, sink in zip(prompts(n_slots), sinks, strict=True):
            engine.submit(prompt, SamplingParams(temperature=0, max_tokens=steps, logprobs=0), sink)
        ends = [sink.wait(timeout=1200) for sink in sinks]
    finally:
        engine.stop()
    return [
        {
            "tokens": sink.tokens,
            "logprob_bits": [
                int(np.float32(lp.logprob).view(np.uint32))
                for e in sink.seen
                if isinstance(e, Delta)
                for lp in e.logprobs
            ],
            "finish": end.reason.value,
        }
        for sink, end in zip(sinks, ends, strict=True)
    ]


def run(
    model: str,
    n_slots: int,
    steps: int,
    gpu_layers: int,
    env: dict[str, str],
    overrides: dict | None = None,
) -> list[dict]:
    """generate() in a process of its own with these switches set (and no other)."""
    child_env = {k: v for k, v in os.environ.items() if k not in SWITCHES} | env
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from tests.gpu.fast_path import "
        "generate; print(json.dumps(generate(sys.argv[2], *map(int, sys.argv[3:6]), "
        "json.loads(sys.argv[6]))))"
    )
    args = [str(ROOT), model, str(n_slots), str(steps), str(gpu_layers), json.dumps(overrides)]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first step where two token lists part (a stop in one of them included), or None."""
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


def compare(base: list[dict], other: list[dict]) -> dict:
    """Equal tokens and log-probability bits, request by request, and where they first part."""
    pairs = [(b["tokens"], o["tokens"]) for b, o in zip(base, other, strict=True)]
    n = sum(len(b) for b, _ in pairs)
    equal = sum(x == y for b, o in pairs for x, y in zip(b, o, strict=False))
    return {
        "identical": base == other,
        "token_share": equal / max(n, 1),
        "first_differing": [first_difference(b, o) for b, o in pairs],
    }


def described(res: dict) -> str:
    """compare()'s result in words."""
    return (
        f"identical {res['identical']}, tokens equal {res['token_share']:.1%}, first differing "
        f"step per request {res['first_differing']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--gpu-layers", type=int, default=999)
    ap.add_argument("--slots", default="1,8")
    a = ap.parse_args(argv)
    if a.model is None:
        from pyqsa.demo_model import demo_model_path

        a.model = str(demo_model_path())
    status = 0
    for n_slots in (int(s) for s in a.slots.split(",")):
        base = run(a.model, n_slots, a.steps, a.gpu_layers, {})
        steps = [len(r["tokens"]) for r in base]
        for label, env, gated in (
            ("unfused", UNFUSED, True),
            ("combine apart", COMBINE_APART, True),
            ("gates apart", GATES_APART, True),
            ("inputs copied with waits", INPUTS_SYNC, True),
            ("ungrouped", UNGROUPED, False),
            ("mix unfused", MIX_UNFUSED, False),
        ):
            res = compare(base, run(a.model, n_slots, a.steps, a.gpu_layers, env))
            ok = res["identical"] or not gated
            status |= not ok
            switches = " ".join(f"{k}={v}" for k, v in env.items())
            print(
                f"{n_slots} slot(s), {steps} tokens each, fast path vs {label} ({switches}): "
                f"{described(res)}{'' if gated else ' (reported, not gated)'}: "
                f"{'OK' if ok else 'FAIL'}",
                flush=True,
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
