"""The real server and engine on a runner that stands in for a GPU: each forward pass waits
`--launch-ms` with the GIL released (llama_decode queuing the pass), hands over the last step's
events (on_launch), then waits in its first result read until `--forward-ms` after the pass
began (the device's work: the first pyqsa_sampled_get waits for it) and draws every sampled row
"on the device"; the other native calls around a pass (a result read per row, the ledger) are
stand-ins that release the GIL as cffi calls do. What the server's host side costs a GPU step,
without a GPU (ideal rate: slots / forward-ms).

    python bench/serve_sim.py --port 8772 &
    python bench/serve_load.py http://127.0.0.1:8772 --requests 8 --prompt-tokens 100 \\
        --max-tokens 300 --repeats 3
    python bench/serve_sim.py --load    # the same load, started here; then the figures
    python bench/serve_sim.py --bare    # no server: the engine's events to plain sinks

On exit: in the passes of 8 decode tokens, the wall time a step against the engine's parts, and
each thread's waits for the GIL and CPU time a step. The GIL waits are exact where the script
runs with bench/cuda_calls.c preloaded (LD_PRELOAD=/tmp/cuda_calls.so, built as its header
says); otherwise the times of the stand-in native calls, which include them.
"""

from __future__ import annotations

import ctypes
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyqsa import demo_model  # noqa: E402
from pyqsa.engine import Delta, Engine, EngineConfig, Finished, SamplingParams  # noqa: E402
from pyqsa.engine.runner import LlamaModel  # noqa: E402
from pyqsa.native import SampleResult  # noqa: E402
from server.app import create_app  # noqa: E402
from server.cli import _template, _uvicorn_server  # noqa: E402

_libc = ctypes.CDLL(None)  # a ctypes call releases the GIL, as a cffi call does


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _wait_until(deadline: float) -> None:
    """Sleep until time.perf_counter() (CLOCK_MONOTONIC) reads `deadline`, without the GIL."""
    t = _Timespec(int(deadline), int((deadline % 1) * 1e9))
    while _libc.clock_nanosleep(1, 1, ctypes.byref(t), None):  # CLOCK_MONOTONIC, TIMER_ABSTIME
        pass


def _shim_snapshot() -> dict[tuple[int, str], tuple[int, float]]:
    """bench/cuda_calls.c's figures per (thread id, call), where it is preloaded."""
    try:
        snapshot = _libc.shim_snapshot
    except AttributeError:
        return {}
    buf = ctypes.create_string_buffer(1 << 16)
    n = snapshot(buf, len(buf))
    out = {}
    for line in buf.raw[:n].decode().splitlines():
        tid, name, count, seconds = line.split()
        out[(int(tid), name)] = (int(count), float(seconds))
    return out


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


class SleepRunner:
    samples_on_device = True

    def __init__(self, n_vocab: int, forward_s: float, launch_s: float, slots: int) -> None:
        self.n_vocab, self.forward_s, self.launch_s, self.slots = (
            n_vocab,
            forward_s,
            launch_s,
            slots,
        )
        self.waits: Counter[str] = Counter()  # seconds at each kind of stand-in native call
        self.passes = 0
        self.full: list[tuple[float, float]] = []  # (start, end) of each pass of `slots` tokens
        self.marks: list[tuple[float, dict, dict]] = []  # at the 10th and 250th such pass
        self.names: dict[int, str] = {}

    def _native(self, what: str) -> None:
        t = time.perf_counter()
        _libc.getpid()
        self.waits[what] += time.perf_counter() - t

    def run(self, chunks, draws=None, on_launch=None):
        self.passes += 1
        started = time.perf_counter()
        full = len(chunks) == self.slots and all(len(c.tokens) == 1 for c in chunks)
        if full and len(self.full) in (10, 250):
            self.names.update((t.native_id, t.name) for t in threading.enumerate())
            self.marks.append((started, _shim_snapshot(), _thread_cpu()))
        t = time.perf_counter()
        _wait_until(started + self.launch_s)  # llama_decode: the pass queued
        self.waits["launch"] += time.perf_counter() - t - self.launch_s
        if on_launch:
            on_launch()
        self._native("error check")
        out = []
        for c in chunks:
            if c.sample:
                if not out:  # the first read waits for the device
                    _wait_until(started + self.forward_s)
                    self.waits["device wait"] += time.perf_counter() - started - self.forward_s
                else:
                    self._native("result read")
                out.append(SampleResult(1000 + c.tokens[-1] % 1000, float("nan"), ()))
        if full:
            self.full.append((started, time.perf_counter()))
        return out

    def ledger(self) -> dict[str, int]:
        self._native("ledger")
        return {}

    def release(self, slot: int) -> None: ...
    def request_abort(self) -> None: ...
    def clear_abort(self) -> None: ...
    def paging_stats(self) -> None: ...
    def paging_layers(self) -> None: ...
    def graph_stats(self) -> dict[str, int]:
        return {}


def report(runner: SleepRunner) -> None:
    """The figures of the passes of `slots` decode tokens (see the module's doc)."""
    steps = runner.full[5:-5]
    gaps = [b[0] - a[0] for a, b in zip(steps, steps[1:], strict=False) if b[0] - a[0] < 1.0]
    if not gaps:
        print("no passes of every slot decoding together")
        return
    wall = statistics.mean(gaps)
    forward = statistics.mean(e - s for s, e in steps)
    print(
        f"{len(gaps)} steps of {runner.slots} decode tokens: wall {1e3 * wall:.3f} ms a step "
        f"({runner.slots / wall:.1f} tok/s; ideal {1e3 * runner.forward_s:.3f} ms, "
        f"{runner.slots / runner.forward_s:.1f} tok/s), in the runner {1e3 * forward:.3f} ms"
    )
    n = max(runner.passes, 1)
    waits = ", ".join(f"{k} {1e3 * v / n:.3f}" for k, v in runner.waits.items())
    print(f"  stand-in native calls, ms a pass past their own time (GIL waits in them): {waits}")
    if len(runner.marks) < 2:
        return
    (t0, calls0, cpu0), (t1, calls1, cpu1) = runner.marks[:2]
    n = 240  # passes between the marks
    rows: dict[int, list[str]] = {}
    for (tid, name), (count, seconds) in calls1.items():
        c0, s0 = calls0.get((tid, name), (0, 0.0))
        if count > c0:
            rows.setdefault(tid, []).append(
                f"{name} {(count - c0) / n:.1f}x {1e3 * (seconds - s0) / n:.3f} ms"
            )
    for tid, seconds in cpu1.items():
        if seconds > cpu0.get(tid, 0.0):
            rows.setdefault(tid, []).append(
                f"cpu {1e3 * (seconds - cpu0.get(tid, 0.0)) / n:.3f} ms"
            )
    print(f"  a step, per thread (mean of {n} steps of {1e3 * (t1 - t0) / n:.3f} ms):")
    for tid, parts in rows.items():
        print(f"    {runner.names.get(tid, tid)}: {', '.join(parts)}")


def bare(engine: Engine, slots: int, max_tokens: int) -> None:
    """`slots` requests as serve_load.py sends them, their events to plain sinks."""
    done = threading.Semaphore(0)

    def sink(ev: Delta | Finished) -> None:
        if isinstance(ev, Finished):
            done.release()

    rng = random.Random(0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for _ in range(slots):
        engine.submit([rng.randrange(100, 5000) for _ in range(100)], params, sink)
    for _ in range(slots):
        done.acquire()


@click.command()
@click.option("--port", default=8772, show_default=True)
@click.option("--slots", default=8, show_default=True)
@click.option(
    "--forward-ms",
    default=9.35,
    show_default=True,
    help="one pass (decode.py's step at 8 x 32K on an H100)",
)
@click.option(
    "--launch-ms", default=0.45, show_default=True, help="its part until llama_decode returns"
)
@click.option("--load", is_flag=True, help="serve_load.py's 8 requests against it, then exit")
@click.option("--bare", "bare_", is_flag=True, help="no server: the same requests to plain sinks")
@click.option(
    "--max-tokens", default=300, show_default=True, help="each request's (--load, --bare)"
)
@click.option("--switch-interval", type=float, help="sys.setswitchinterval (seconds)")
def main(port, slots, forward_ms, launch_ms, load, bare_, max_tokens, switch_interval) -> None:
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    model = LlamaModel(str(demo_model.demo_model_path()), 0)  # its tokenizer only
    runner = SleepRunner(model.n_vocab, forward_ms / 1e3, launch_ms / 1e3, slots)
    config = EngineConfig(
        "sim", n_slots=slots, ctx_per_slot=4096, max_batch_tokens=512, sample_on_device=True
    )
    engine = Engine(config, runner, model).start()
    try:
        if bare_:
            bare(engine, slots, max_tokens)
        else:
            app = create_app(engine, model, "sim", _template(model, None))
            server = _uvicorn_server(app, "127.0.0.1", port, lambda url: on_ready(url))

            def on_ready(url: str) -> None:
                print(url, flush=True)
                if load:
                    threading.Thread(target=run_load, args=(url,), daemon=True).start()

            def run_load(url: str) -> None:
                cmd = [sys.executable, "-m", "pyqsa.bench.serve_load", url, "--requests"]
                cmd += [str(slots), "--prompt-tokens", "100", "--max-tokens", str(max_tokens)]
                path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
                env = dict(os.environ, PYTHONPATH=path)
                env.pop("LD_PRELOAD", None)  # the client's threads are no part of the figures
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                lines = (out.stdout or out.stderr).strip().splitlines()
                print(lines[-1] if lines else f"serve_load exited with {out.returncode}")
                server.should_exit = True

            server.run()
    finally:
        engine.stop()
    report(runner)


if __name__ == "__main__":
    main()
