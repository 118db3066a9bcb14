"""A prefix snapshot's cost on the thread that takes it, alone and beside copies on another thread.

    python3 bench/save_probe.py MODEL [--tokens 32000] [--saves 8]

One runner as the server makes it (8 slots, the prefix cache's stages and rows reader), three
slots prefilled with the same random prompt; then `--saves` snapshots of slots 0 and 1
(Runner.snapshot, the engine thread's part in the server), each followed by the copy of its
staged head (SeqRows.fill_head, the prefix cache's copier thread in the server), timed:
  alone             nothing else runs
  beside rows       another thread reads slot 2's rows through the rows reader, over and over
                    (what the copier does while the engine decodes)
  beside memory     another thread copies 512 MiB into fresh numpy arrays, over and over
Per save: the wall time, the thread's user and system CPU time and page faults
(getrusage(RUSAGE_THREAD): their resolution is the kernel's tick, 4 ms here, so they are means
over the saves), then the fill's time. Then a snapshot loaded back `--saves` times: into the slot
that holds its rows (Runner.resume) and into another slot with its rows (Runner.restore), each
the engine thread's in the server, where every slot waits for it."""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import threading
import time

import numpy as np

from pyqsa.engine.config import EngineConfig
from pyqsa.engine.request import Request, SamplingParams
from pyqsa.engine.runner import LlamaModel, LlamaRunner
from pyqsa.engine.scheduler import Chunk
from pyqsa.engine.slots import SlotLease


def prefill(runner: LlamaRunner, slot: int, tokens: list[int], step: int) -> None:
    req = Request(f"probe/{slot}", tokens, SamplingParams(), lambda ev: None, len(tokens) + 1)
    lease = SlotLease(slot, 0, len(tokens) + 1)
    for start in range(0, len(tokens), step):
        runner.run([Chunk(req, lease, start, tuple(tokens[start : start + step]))])


def saves(runner: LlamaRunner, label: str, k: int) -> None:
    rows = []
    for i in range(k):
        r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        head, source = runner.snapshot(i % 2)
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
        source.fill_head()
        t2 = time.perf_counter()
        source.close()
        del head
        rows.append(
            (
                1e3 * (t1 - t0),
                1e3 * (r1.ru_utime - r0.ru_utime),
                1e3 * (r1.ru_stime - r0.ru_stime),
                r1.ru_minflt - r0.ru_minflt,
                1e3 * (t2 - t1),
            )
        )
    mean = [sum(r[j] for r in rows) / k for j in range(4)]
    fill = statistics.median(r[4] for r in rows)
    print(
        f"{label}: save ms "
        + " ".join(f"{r[0]:.2f}" for r in rows)
        + f" | median {statistics.median(r[0] for r in rows):.2f}; user {mean[1]:.1f} sys "
        f"{mean[2]:.1f} faults {mean[3]:.0f} a save; fill {fill:.1f} ms",
        flush=True,
    )


def loads(runner: LlamaRunner, head, rows, n: int, k: int) -> None:
    """Slot 2's snapshot loaded back: into slot 2, which holds its rows (Runner.resume), and into
    slot 3 with its rows (Runner.restore), k times each, on the engine thread in the server."""
    times: dict[str, list[float]] = {"resume": [], "restore": []}
    for _ in range(k):
        t0 = time.perf_counter()
        runner.resume(2, head)
        t1 = time.perf_counter()
        runner.restore(3, head, [(0, n, rows)])
        t2 = time.perf_counter()
        times["resume"].append(1e3 * (t1 - t0))
        times["restore"].append(1e3 * (t2 - t1))
    print(
        "; ".join(
            f"{what} ms "
            + " ".join(f"{t:.2f}" for t in ts)
            + f" | median {statistics.median(ts):.2f}"
            for what, ts in times.items()
        ),
        flush=True,
    )


def beside(runner: LlamaRunner, label: str, k: int, work) -> None:
    """saves() while another thread runs work() over and over."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            work()

    th = threading.Thread(target=loop)
    th.start()
    time.sleep(0.5)
    try:
        saves(runner, label, k)
    finally:
        stop.set()
        th.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--saves", type=int, default=8)
    args = ap.parse_args()
    n = args.tokens
    config = EngineConfig(
        args.model,
        n_slots=8,
        ctx_per_slot=n + 4000,
        max_batch_tokens=512,
        prefix_cache_bytes=8 << 30,
    )
    model = LlamaModel(args.model)
    runner = LlamaRunner(model, config)
    try:
        rng = random.Random(0)
        tokens = [rng.randrange(1000, 20000) for _ in range(n)]
        for slot in range(3):
            prefill(runner, slot, tokens, config.max_batch_tokens)
        saves(runner, "alone", args.saves)
        saves(runner, "alone again", args.saves)
        head, kept = runner.snapshot(2)
        kept.fill_head()
        beside(runner, "beside rows", args.saves, lambda: kept.get(0, n))
        loads(runner, head, kept.get(0, n), n, args.saves)
        kept.close()
        src = np.ones(512 << 20, np.uint8)

        def fresh_copy() -> None:
            a = np.empty_like(src)
            a[:] = src

        beside(runner, "beside memory", args.saves, fresh_copy)
    finally:
        runner.close()
        model.close()


if __name__ == "__main__":
    main()
