"""GPU machine, after bench/gpu_run.sh wrote a full-shape model: is a follow-up served from the
prefix cache on CUDA the same as without the cache, and where it is not, is that the rounding
of its chunks? tests/unit/test_prefix_exact.py compares them bit for bit on the CPU, whose
matrix products round a row the same whatever the rows beside it; CUDA's choose kernels and
splits by the batch's size, so a row computed in another chunk may round otherwise.

Per case, an engine with the cache and one without on the same model and flags: a history of
--history tokens (the same chunks on both: one compared to the other first), then the history
plus --new tokens, which the cached engine computes as one chunk after resuming the history's
state. With --chunk equal to --new and the history a multiple of it, the cold engine computes
the new tokens as one chunk of the same size too ("aligned": the same arithmetic, so the same
tokens and logprobs are required); with a chunk of 2048 it computes them inside a wider one
("wider", reported: where the replies part, and the logprob differences before).

    python3 tests/gpu/prefix_exact.py MODEL [--history 12000] [--new 500] [--out FILE]

(PYQSA_BENCH_COMMIT names the commit the record carries, as for bench/gpu_run.sh.)

Exit status 1 when an aligned case or a history differs; one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pyqsa.bench.meta import git_commit, gpu_name
from pyqsa.engine import EngineConfig, SamplingParams, load_engine
from pyqsa.engine.request import Delta, Finished
from pyqsa.engine.runner import LlamaModel

REPLY = SamplingParams(temperature=0, max_tokens=16, logprobs=5, ignore_eos=True)


@dataclass
class Reply:
    """A request's tokens, logprobs and end, gathered from its events."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[tuple[int, float, tuple]] = field(default_factory=list)
    cached: int = 0
    first_s: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    t0: float = field(default_factory=time.perf_counter)

    def __call__(self, ev) -> None:
        if isinstance(ev, Delta):
            if self.first_s is None and ev.token_ids:
                self.first_s = time.perf_counter() - self.t0
            self.tokens += ev.token_ids
            self.logprobs += [(lp.token, lp.logprob, tuple(lp.top)) for lp in ev.logprobs or ()]
        elif isinstance(ev, Finished):
            assert ev.error is None, ev.error
            self.cached = ev.cached_tokens
            self.done.set()


def ask(engine, prompt: list[int]) -> Reply:
    reply = Reply()
    engine.submit(prompt, REPLY, reply)
    assert reply.done.wait(600)
    deadline = time.monotonic() + 60  # its reply computed again as a prompt, in the cache
    while engine.stats().busy_slots or engine.scheduler.waiting:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return reply


def compare(a: Reply, b: Reply) -> dict:
    pairs = enumerate(zip(a.tokens, b.tokens, strict=True))
    first = next((i for i, (x, y) in pairs if x != y), None)
    n = len(a.tokens) if first is None else first
    deltas = [abs(x[1] - y[1]) for x, y in zip(a.logprobs[:n], b.logprobs[:n], strict=True)]

    def margin(r: Reply) -> float | None:
        tops = sorted((v for _, v in r.logprobs[first][2]), reverse=True)
        return tops[0] - tops[1] if len(tops) > 1 else None

    return {
        "same": (a.tokens, a.logprobs) == (b.tokens, b.logprobs),
        "first_difference": first,
        "max_logprob_delta_before": max(deltas, default=0.0),
        "first_token_logprob_delta": abs(a.logprobs[0][1] - b.logprobs[0][1]),
        "margins_there": None if first is None else [margin(a), margin(b)],
    }


def case(model, path: str, name: str, chunk: int, hot_blocks: int, args) -> dict:
    rng = np.random.default_rng(28)
    history = [int(t) for t in rng.integers(200, 20000, args.history)]
    follow = history + [int(t) for t in rng.integers(200, 20000, args.new)]
    common = dict(
        n_slots=1,
        ctx_per_slot=args.history + args.new + 64,
        max_batch_tokens=min(chunk, 512),
        max_prefill_tokens=chunk,
        hot_blocks=hot_blocks,
    )
    warm = load_engine(EngineConfig(path, prefix_cache_bytes=8 << 30, **common), model)[0]
    cold = load_engine(EngineConfig(path, prefix_cache_bytes=0, **common), model)[0]
    try:
        first = compare(ask(warm, history), ask(cold, history))
        before = warm.stats().prefix
        w = ask(warm, follow)
        after = warm.stats().prefix
        c = ask(cold, follow)
        return {
            "case": name,
            "chunk": chunk,
            "hot_blocks": hot_blocks,
            "history": first,
            "cached_tokens": w.cached,
            "starts": {k: after.starts[k] - before.starts[k] for k in after.starts},
            "follow_up": compare(w, c),
            "first_token_s": {"cached": w.first_s, "cold": c.first_s},
            "engine_seconds": after.engine_seconds - before.engine_seconds,
        }
    finally:
        warm.stop()
        cold.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--history", type=int, default=12000)
    ap.add_argument("--new", type=int, default=500)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.history % args.new:
        ap.error("--history must be a multiple of --new (the aligned case's chunks)")
    model = LlamaModel(args.model)
    try:
        cases = [
            case(model, args.model, "aligned, unpaged", args.new, 0, args),
            case(model, args.model, "aligned, paged", args.new, 1024, args),
            case(model, args.model, "wider, paged", 2048, 1024, args),
        ]
    finally:
        model.close()
    aligned_ok = all(c["follow_up"]["same"] for c in cases if c["case"].startswith("aligned"))
    histories_ok = all(c["history"]["same"] for c in cases)
    record = {
        "scenario": "prefix-exact",
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_commit(),
        "gpu": gpu_name(),
        "model": Path(args.model).name,
        "history": args.history,
        "new": args.new,
    }
    record |= {"aligned_same": aligned_ok, "histories_same": histories_ok, "cases": cases}
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if aligned_ok and histories_ok else 1


if __name__ == "__main__":
    sys.exit(main())
