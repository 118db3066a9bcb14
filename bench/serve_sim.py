"""The real server and engine on a runner that stands in for a GPU: each forward pass sleeps
`--forward-ms` with the GIL released and draws every sampled row "on the device"; the native
calls around a pass (a sampler set per row, a result read per row, the ledger) are stand-ins
that release the GIL as cffi calls do. With bench/serve_load.py against it, the decode rate
says what the server's host side costs a GPU step (ideal: slots / forward-ms), without a GPU.

    python bench/serve_sim.py --port 8772 &
    python bench/serve_load.py http://127.0.0.1:8772 --requests 8 --prompt-tokens 100 \\
        --max-tokens 300 --repeats 3

On exit (Ctrl-C) it prints the GIL waits per step at those native calls: time the engine
thread waited there while another thread (the event loop) held the GIL.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections import Counter
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyqsa import demo_model  # noqa: E402
from pyqsa.engine import Engine, EngineConfig  # noqa: E402
from pyqsa.engine.runner import LlamaModel  # noqa: E402
from pyqsa.native import SampleResult  # noqa: E402
from server.app import create_app  # noqa: E402
from server.cli import _template, _uvicorn_server  # noqa: E402

_libc = ctypes.CDLL(None)  # a ctypes call releases the GIL, as a cffi call does


class SleepRunner:
    samples_on_device = True

    def __init__(self, n_vocab: int, forward_s: float) -> None:
        self.n_vocab, self.forward_s = n_vocab, forward_s
        self.waits: Counter[str] = Counter()  # seconds waited at each kind of native call
        self.passes = 0

    def _native(self, what: str) -> None:
        t = time.perf_counter()
        _libc.getpid()
        self.waits[what] += time.perf_counter() - t

    def run(self, chunks, draws=None, on_launch=None):
        self.passes += 1
        for _ in chunks:
            self._native("sampler set")
        if on_launch:
            on_launch()
        time.sleep(self.forward_s)
        out = []
        for c in chunks:
            if c.sample:
                self._native("result read")
                out.append(SampleResult(1000 + c.tokens[-1] % 1000, float("nan"), ()))
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


@click.command()
@click.option("--port", default=8772, show_default=True)
@click.option("--slots", default=8, show_default=True)
@click.option("--forward-ms", default=19.0, show_default=True, help="one pass (H200, 8 x 32K)")
def main(port: int, slots: int, forward_ms: float) -> None:
    model = LlamaModel(str(demo_model.demo_model_path()), 0)  # its tokenizer only
    runner = SleepRunner(model.n_vocab, forward_ms / 1e3)
    config = EngineConfig(
        "sim", n_slots=slots, ctx_per_slot=4096, max_batch_tokens=512, sample_on_device=True
    )
    engine = Engine(config, runner, model).start()
    try:
        app = create_app(engine, model, "sim", _template(model, None))
        _uvicorn_server(app, "127.0.0.1", port, lambda url: print(url, flush=True)).run()
    finally:
        engine.stop()
    n = max(runner.passes, 1)
    waits = ", ".join(f"{k} {1e3 * v / n:.3f}" for k, v in runner.waits.items())
    print(f"GIL waits, ms per pass ({n} passes): {waits}")


if __name__ == "__main__":
    main()
