"""The host's part of a decode step on the GPU machine: the CUDA runtime calls of each thread
(bench/cuda_calls.c, preloaded), counted and timed per step.

    python3 bench/host_split.py decode MODEL [--context 32768] [--steps 32]
        bench/decode.py's steps (1 and 8 sequences, host and device sampling): per step the time
        until llama_decode returned and the wait in llama_synchronize after it, and the calls
        inside each
    python3 bench/host_split.py serve MODEL [--prompt-tokens 32000] [-- SERVE FLAGS]
        `pyqsa serve --slots 8` under serve_load.py's 8 requests decoding together: in a window
        of that decode, the wall time and the engine's step parts (/metrics) and each thread's
        calls per step
    python3 bench/host_split.py engine MODEL [--prompt-tokens 32000] [-- SERVE FLAGS]
        the same engine (start_engine, the same flags) and the same 8 requests in this process,
        without the HTTP server: its events go to plain sinks. Against `serve`, what the server
        costs the decode; against `decode`, what the engine does. Then the engine thread's work
        in the together window's longest gap and in its first steps: each pass (tokens, time, how
        its graph ran) and each prefix snapshot, timed where they ran (`trace`), each save with
        its CUDA calls and its thread's CPU time, system time and page faults

Each thread's calls include its waits for the GIL after every call that let go of it (GIL_wait:
ctypes and cffi calls, socket I/O), where python's libpython is a shared library (see
cuda_calls.c). The library is built with gcc into /tmp/cuda_calls.so on the first run; the
script then runs itself again with it preloaded."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = Path("/tmp/cuda_calls.so")
URL = "http://127.0.0.1:8766"


def parse_snapshot(lines: list[str]) -> dict[tuple[str, str], tuple[int, float]]:
    """(thread id, call) -> (count, seconds) from cuda_calls.c's snapshot lines."""
    out = {}
    for line in lines:
        tid, name, n, s = line.split()
        out[(tid, name)] = (int(n), float(s))
    return out


_SHIM_THREAD = threading.local()  # per calling thread: the shim and a buffer for its snapshot


def shim_calls() -> dict[tuple[str, str], tuple[int, float]]:
    """The preloaded shim's counters now (parse_snapshot's), on any thread."""
    buf = getattr(_SHIM_THREAD, "buf", None)
    if buf is None:
        buf = _SHIM_THREAD.buf = ctypes.create_string_buffer(1 << 16)
        _SHIM_THREAD.shim = ctypes.CDLL(None)  # the process, which the shim is preloaded into
    n = _SHIM_THREAD.shim.shim_snapshot(buf, len(buf))
    return parse_snapshot(buf.raw[:n].decode().splitlines())


def per_step(a: dict, b: dict, steps: int) -> dict[str, dict[str, tuple[float, float]]]:
    """thread -> call -> (calls, ms) per step between snapshots a and b."""
    out: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    for key, (n, s) in b.items():
        n0, s0 = a.get(key, (0, 0.0))
        if n != n0:
            out[key[0]][key[1]] = ((n - n0) / steps, 1e3 * (s - s0) / steps)
    return out


def described(calls: dict[str, tuple[float, float]]) -> str:
    rows = sorted(calls.items(), key=lambda kv: -kv[1][1])
    return ", ".join(f"{name} {n:.1f}x {ms:.3f} ms" for name, (n, ms) in rows)


def decode(args: argparse.Namespace) -> None:
    import llama_cpp as L

    from pyqsa.bench.decode import decode_tokens, parse_args
    from pyqsa.bench.decode_bench import Bench

    bench_args = [str(args.model), "--variant", "pyqsa", "--contexts", str(args.context)]
    bench_args += ["--seqs", "1,8", "--steps", str(args.steps), "--warmup", "4"]
    bench = Bench(L, Path(args.model), parse_args(bench_args))
    for sampling in ("host", "device"):
        bench.args.sampling = sampling
        bench.open(args.context, 8)
        bench.prefill(args.context - decode_tokens(bench.args))
        for n_seq in (1, 8):
            pos = bench.copy_seq0(n_seq)
            steps = []

            def timed(self, steps=steps, plain=Bench._decode) -> None:
                a, t0 = shim_calls(), time.perf_counter()
                plain(self)
                b, t1 = shim_calls(), time.perf_counter()
                self.L.llama_synchronize(self.ctx)
                c, t2 = shim_calls(), time.perf_counter()
                steps.append((t1 - t0, t2 - t1, per_step(a, b, 1), per_step(b, c, 1)))

            Bench._decode, plain = timed, Bench._decode
            try:
                bench.decode(n_seq, pos, fresh_copies=True)
            finally:
                Bench._decode = plain
            steps = steps[4:]  # the timed ones
            launch = statistics.median(s[0] for s in steps) * 1e3
            wait = statistics.median(s[1] for s in steps) * 1e3
            print(
                f"\n## sampling {sampling}, {n_seq} seqs at {args.context}: "
                f"llama_decode {launch:.3f} ms, then llama_synchronize {wait:.3f} ms "
                f"(medians of {len(steps)} steps)"
            )
            for label, i in (("inside llama_decode", 2), ("inside llama_synchronize", 3)):
                total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
                for s in steps:
                    for calls in s[i].values():
                        for name, (n, ms) in calls.items():
                            total[name][0] += n / len(steps)
                            total[name][1] += ms / len(steps)
                print(f"  {label}: {described({k: tuple(v) for k, v in total.items()})}")
        bench.close()


def serve(args: argparse.Namespace) -> None:
    import httpx

    from pyqsa.bench.serve_load import engine_counters

    out = Path(f"/tmp/host-split-{os.getpid()}.txt")
    env = dict(os.environ, SHIM_OUT=str(out))
    cmd = ["pyqsa", "serve", str(args.model), "--port", "8766", "--slots", "8"]
    cmd += ["--ctx", str(args.prompt_tokens + 4000), "--batch-tokens", "512", *args.serve_flags]
    log = open("/tmp/host-split-serve.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{URL}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        load_cmd = [sys.executable, "-m", "pyqsa.bench.serve_load", URL, "--requests", "8"]
        load_cmd += [
            "--prompt-tokens",
            str(args.prompt_tokens),
            "--max-tokens",
            "256",
            "--repeats",
            "1",
        ]
        load = subprocess.Popen(load_cmd, stdout=subprocess.PIPE, text=True)
        # the window: once the steps come 20 in 0.3 s (decode only; a prefill chunk takes ~60 ms)
        seen: list[tuple[float, float]] = []
        marks = []
        while load.poll() is None and not marks:
            t, steps = time.perf_counter(), engine_counters(URL)["steps"]
            seen.append((t, steps))
            older = [s for s in seen if t - s[0] >= 0.3]
            if older and steps - older[-1][1] >= 20:
                for mark in ("start", "end"):
                    out.with_name(out.name + ".trigger").write_text(mark + "\n")
                    time.sleep(0.05)
                    t0 = time.perf_counter()
                    counters = engine_counters(URL)
                    marks.append((t0 + time.perf_counter()) / 2)
                    marks.append(counters)
                    if mark == "start":
                        time.sleep(1.2)
            time.sleep(0.05)
        print(load.communicate()[0].strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=60)
    if len(marks) < 4:
        sys.exit("no window of 8 requests decoding together was found")
    ta, a, tb, b = marks
    snaps: dict[str, list[str]] = {}
    for line in out.read_text().splitlines():
        if line.startswith("== "):
            snaps[line.split()[1]] = current = []
        else:
            current.append(line)
    window(
        f"serve {' '.join(args.serve_flags)}",
        (ta, a, parse_snapshot(snaps["start"])),
        (tb, b, parse_snapshot(snaps["end"])),
        {str(server.pid): "the event loop"},
    )


def window(label: str, start: tuple, end: tuple, names: dict[str, str]) -> None:
    """The window between two (time, engine counters, shim snapshot) marks: the wall time and
    the engine's step parts per step, then each thread's calls per step (`names`: tid -> what
    the thread is, where known)."""
    (ta, a, sa), (tb, b, sb) = start, end
    steps = b["steps"] - a["steps"]
    parts = ("forward", "launch", "host", "copy", "prefix")
    print(
        f"\n## {label}: {steps:.0f} steps in the window; per step wall "
        f"{1e3 * (tb - ta) / steps:.3f} ms, "
        + ", ".join(f"{k} {1e3 * (b[k] - a[k]) / steps:.3f} ms" for k in parts if k in a)
    )
    threads = per_step(sa, sb, steps)
    for tid, calls in threads.items():
        what = f" ({names[tid]})" if tid in names else ""
        print(f"  thread {tid}{what}: {described(calls)}")
    if not any("GIL_wait" in calls for calls in threads.values()):
        print("  (no GIL waits: this python's libpython is not a shared library the shim sees)")


def trace(eng, calls=None) -> list[dict]:
    """Times the engine's passes and prefix snapshots on its own objects (wrapped in place, for
    this process only): each one's start, end and what it was, in the order they ran; with
    `calls` (a shim snapshot, parse_snapshot's), each save's CUDA calls on its thread too."""
    events: list[dict] = []
    run, runner = eng.runner.run, eng.runner

    def timed_run(chunks, *args, **kwargs):
        before, t0 = runner.graph_stats(), time.perf_counter()
        try:
            return run(chunks, *args, **kwargs)
        finally:
            t1, after = time.perf_counter(), runner.graph_stats()
            graphs = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            tokens = sum(len(c.tokens) for c in chunks)
            events.append({"what": f"pass of {tokens} tokens", "t0": t0, "t1": t1, **graphs})

    def timed(what: str, call):
        def timed_call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                events.append({"what": what, "t0": t0, "t1": time.perf_counter()})

        return timed_call

    def timed_save(*args, **kwargs):
        before = calls() if calls else {}
        r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        try:
            return save(*args, **kwargs)
        finally:
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
            event = {"what": "  its save (Runner.snapshot)", "t0": t0, "t1": t1}
            # its thread's CPU time and page faults: a save that waits shows little of either
            user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
            event["cpu_ms"] = round(1e3 * (user + sys_), 2)
            event["sys_ms"] = round(1e3 * sys_, 2)
            event["faults"] = r1.ru_minflt - r0.ru_minflt
            if calls:
                tid = str(threading.get_native_id())
                own = {k: v for k, v in calls().items() if k[0] == tid}
                event["calls"] = described(per_step(before, own, 1)[tid])
            events.append(event)

    save = eng.runner.snapshot
    eng.runner.run = timed_run
    eng.prefix.snapshot = timed("snapshot", eng.prefix.snapshot)
    eng.runner.snapshot = timed_save
    # the copier's work, on its thread: a head's fill, a segment of rows
    from pyqsa import native

    native.SeqRows.fill_head = timed("  head fill (copier)", native.SeqRows.fill_head)
    native.SeqRows.get = timed("  rows copy (copier)", native.SeqRows.get)
    return events


def beside_copies(events: list[dict], a: float, b: float, tokens: int) -> str:
    """The passes of `tokens` tokens in [a, b]: the median time of those that overlapped a copy
    of the copier's and of those that did not."""
    copies = [e for e in events if "(copier)" in e["what"]]
    passes = [e for e in events if e["what"] == f"pass of {tokens} tokens" and a <= e["t0"] <= b]

    def overlaps(p: dict) -> bool:
        return any(c["t0"] < p["t1"] and c["t1"] > p["t0"] for c in copies)

    parts = []
    for label, group in (("beside a copy", True), ("alone", False)):
        ms = [1e3 * (p["t1"] - p["t0"]) for p in passes if overlaps(p) == group]
        med = f"median {statistics.median(ms):.3f} ms" if ms else "none"
        parts.append(f"{label}: {len(ms)} passes, {med}")
    return f"passes of {tokens} tokens " + "; ".join(parts)


def traced(events: list[dict], a: float, b: float) -> list[str]:
    """The traced events that overlap [a, b], each with its times in ms from a."""
    out = []
    for e in sorted(events, key=lambda e: e["t0"]):
        if e["t1"] > a and e["t0"] < b:
            extra = {k: v for k, v in e.items() if k not in ("what", "t0", "t1")}
            out.append(
                f"    {1e3 * (e['t0'] - a):8.2f} .. {1e3 * (e['t1'] - a):8.2f} ms  "
                f"({1e3 * (e['t1'] - e['t0']):.2f}) {e['what']}" + (f" {extra}" if extra else "")
            )
    return out


def engine(args: argparse.Namespace) -> None:
    """`serve`'s engine and load without the HTTP server: the events go to plain sinks."""
    import random

    import click
    import numpy as np

    sys.path.append(str(ROOT))  # the server package, where it is not installed

    from pyqsa.bench.serve_load import Load, draw_prompts, together_longest_gap, together_rate
    from pyqsa.engine import Delta, Finished, SamplingParams
    from server.cli import _engine_options
    from server.startup import start_engine

    @click.command()
    @_engine_options
    def flags(engine_flags, chat_template):
        return engine_flags

    flag_args = ["--slots", "8", "--ctx", str(args.prompt_tokens + 4000), "--batch-tokens", "512"]
    engine_flags = flags.main([*flag_args, *args.serve_flags], standalone_mode=False)
    eng, llama_model, _ = start_engine(str(args.model), engine_flags)
    events = trace(eng, shim_calls)

    names: dict[str, str] = {}

    def mark() -> tuple:
        names.update((str(t.native_id), t.name) for t in threading.enumerate())
        snapshot = shim_calls()
        s = eng.stats()
        counters = {"steps": s.steps, **s.step_seconds}
        if s.prefix is not None:
            counters |= {"prefix": s.prefix.engine_seconds, "copy": s.prefix.copy_seconds}
        return time.perf_counter(), counters, snapshot

    # serve_load's first run: the same prompts, greedy, exactly 256 tokens each
    prompts, _ = draw_prompts(Load("", prompt_tokens=args.prompt_tokens), random.Random(0))
    runs = [{"times": [], "completion_tokens": 256} for _ in prompts]
    done = threading.Semaphore(0)

    def sink(run: dict):
        def take(ev) -> None:  # on the engine thread
            if isinstance(ev, Delta) and ev.token_ids:
                run["times"].append(time.perf_counter())
            elif isinstance(ev, Finished):
                done.release()

        return take

    params = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
    try:
        for run, prompt in zip(runs, prompts, strict=True):
            ids = np.asarray(prompt, dtype=np.int64)
            eng.submit(prompt, params, sink(run), ids=ids)
        deadline = time.monotonic() + 3600
        while not all(r["times"] for r in runs):  # every prompt in: all decode together
            if time.monotonic() > deadline:
                sys.exit("the 8 requests never all decoded together")
            time.sleep(0.01)
        time.sleep(0.3)
        start = mark()
        time.sleep(1.2)
        end = mark()
        for _ in runs:
            done.acquire()
    finally:
        eng.stop()
        llama_model.close()
    rate, gap = round(together_rate(runs), 1), together_longest_gap(runs)
    print(json.dumps({"together_tok_s": rate, "longest_gap": gap, "at": "the sinks"}))
    window(f"engine {' '.join(args.serve_flags)}", start, end, names)
    w0 = max(r["times"][0] for r in runs)
    g0 = w0 + gap["at_s"]
    print(f"\n## the longest gap ({gap['ms']} ms, {gap['at_s']} s into the window): the engine's")
    print("\n".join(traced(events, g0, g0 + gap["ms"] / 1e3)))
    print("## the window's first 100 ms (from the last first token)")
    print("\n".join(traced(events, w0, w0 + 0.1)))
    print("## " + beside_copies(events, w0, max(r["times"][-1] for r in runs), len(runs)))
    snaps = [e for e in events if e["what"] == "snapshot"]
    print(
        f"## snapshots: {len(snaps)}, "
        + ", ".join(f"{1e3 * (e['t1'] - e['t0']):.1f}" for e in snaps)
        + " ms on the engine thread"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decode")
    d.add_argument("model")
    d.add_argument("--context", type=int, default=32768)
    d.add_argument("--steps", type=int, default=32)
    for what in ("serve", "engine"):
        s = sub.add_parser(what)
        s.add_argument("model")
        s.add_argument("--prompt-tokens", type=int, default=32000)
        s.add_argument("serve_flags", nargs="*")
    args, extra = ap.parse_known_args()
    if extra[:1] == ["--"] and args.what != "decode":  # python < 3.12 leaves them here
        args.serve_flags += extra[1:]
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if str(SHIM) not in os.environ.get("LD_PRELOAD", ""):
        if (
            not SHIM.exists()
            or SHIM.stat().st_mtime < (ROOT / "bench/cuda_calls.c").stat().st_mtime
        ):
            subprocess.run(
                [
                    "gcc",
                    "-O2",
                    "-shared",
                    "-fPIC",
                    "-o",
                    str(SHIM),
                    str(ROOT / "bench/cuda_calls.c"),
                    "-ldl",
                    "-lpthread",
                ],
                check=True,
            )
        os.execve(
            sys.executable, [sys.executable, *sys.argv], dict(os.environ, LD_PRELOAD=str(SHIM))
        )
    {"decode": decode, "serve": serve, "engine": engine}[args.what](args)


if __name__ == "__main__":
    main()
