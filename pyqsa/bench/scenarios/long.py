"""long: `requests` long prompts at once, end to end through `pyqsa serve`, on a paged server
(--kv-offload host; on a GPU within a 24 GiB device budget) and then on an unpaged one, as
tests/gpu/mission.sh runs them (pyqsa.bench.mission's load, without the cancellations): per
request the time to first token and to the last, the window in which all decode together,
peak device memory by the ledger and (on a GPU) nvidia-smi, the paging hit rate, and whether
the ledger came back to where it was right after start.

The document has the figures of a bench/results mission record (the paged server's at the top,
the unpaged one's under "unpaged") and each server's whole load record under "loads".
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path
from typing import Any

from .. import mission, record, smi
from ..serving import served
from . import Bench

SIZES = {
    "quick": {"requests": 8, "prompt_tokens": 300, "max_tokens": 64, "serve":
              "--slots 8 --ctx 2048 --batch-tokens 64 --prefill-batch-tokens 256",
              "paged": "--kv-offload host", "unpaged": "--kv-offload none"},
    "cpu": {"requests": 8, "prompt_tokens": 1800, "max_tokens": 64, "serve":
            "--slots 8 --ctx 2048 --batch-tokens 64 --prefill-batch-tokens 256",
            "paged": "--kv-offload host", "unpaged": "--kv-offload none"},
    "gpu": {"requests": 8, "prompt_tokens": 255000, "max_tokens": 256, "serve":
            "--slots 8 --ctx 262144 --batch-tokens 512 --prefill-batch-tokens 2048",
            "paged": "--kv-offload host --gpu-memory 24", "unpaged": "--kv-offload none"},
}  # fmt: skip
# the prefix cache's snapshots (copies of a stream's state, K/V included) are not this load
COMMON_FLAGS = ["--prefix-cache-gib", "0"]
GiB = 2**30


def one_server(bench: Bench, size: dict[str, Any], which: str, bar) -> dict[str, Any]:
    """The load on the `which` ("paged" or "unpaged") server: mission.load_record's record."""
    flags = [*size["serve"].split(), *size[which].split(), *COMMON_FLAGS, *bench.thread_flags()]
    total = size["requests"] * size["prompt_tokens"]
    done = bar.n

    def progress(seconds: float, prompt_in: float, of: int, busy: float) -> None:
        bar.update(done + min(prompt_in, of) - bar.n)

    log = bench.work / f"long-{which}.log"
    with served(bench.model, flags) as server, open(log, "w") as out:
        smi_file = sample_smi(server.pid, bench.work / f"long-{which}-smi.csv")
        baseline = mission.snapshot(server.url, smi_file)
        baseline["start_lines"] = server.start_lines
        load = mission.LongLoad(
            server.url,
            requests=size["requests"],
            prompt_tokens=size["prompt_tokens"],
            max_tokens=size["max_tokens"],
            serve_flags="pyqsa serve " + " ".join(flags),
            poll=0.25,
            progress_every=1.0,
        )
        with contextlib.redirect_stdout(out):  # the load's own lines go to the log
            rec = mission.load_record(load, baseline, smi_file, progress)
    bar.update(done + total - bar.n)
    return rec


def sample_smi(pid: int, path: Path) -> Path | None:
    """nvidia-smi every second while the server runs, where there is one; the file or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    threading.Thread(target=smi.smi_sample, args=(pid, path, 1.0), daemon=True).start()
    return path


def run(bench: Bench) -> dict[str, Any]:
    size = bench.size(SIZES)
    total = 2 * size["requests"] * size["prompt_tokens"]
    with bench.progress(total, "long", "prompt tok") as bar:
        loads = {which: one_server(bench, size, which, bar) for which in ("paged", "unpaged")}
    doc = record.header("long", bench.model, {"preset": bench.preset, **size})
    figures = mission.loads_figures(loads["paged"], loads["unpaged"], None)
    # a mission record's "flags" is the paged server's command; here "flags" are the sizes
    figures["serve_flags"] = figures.pop("flags")
    doc |= figures
    doc["summary"] = summary(doc)
    doc["loads"] = loads
    return doc


def summary(doc: dict[str, Any]) -> list[dict[str, Any]]:
    n, p = doc["requests"], doc["prompt_tokens"]
    out = []
    for which, figs in (("paged", doc), ("unpaged", doc["unpaged"])):
        peak = figs["peak_device_memory_gib"]
        out += [
            record.figure(f"{which}, {n} x {p}: answered", "requests", [figs["answered"]]),
            record.figure(f"{which}, {n} x {p}: TTFT", "s", figs["ttft_s"]),
            record.figure(f"{which}, {n} x {p}: finish", "s", figs["finish_s"]),
            record.figure(
                f"{which}, {n} x {p}: decode together",
                "tok/s",
                [figs["decode_window"]["tokens_per_s"]],
            ),
            record.figure(f"{which}: peak device (ledger)", "GiB", [peak["ledger"]]),
        ]
        # where the steps of the decode window went (none where the window held too few polls)
        if engine := figs["decode_window"].get("engine"):
            out += [
                record.figure(
                    f"{which}: decode step, {part}", "ms", [engine[f"{part}_ms_per_step"]]
                )
                for part in ("forward", "host")
            ]
        if peak["nvidia_smi"] is not None:  # a GPU's
            out.append(
                record.figure(f"{which}: peak device (nvidia-smi)", "GiB", [peak["nvidia_smi"]])
            )
    out.append(record.figure("paged: hit rate", "share", [doc["hit_rate"]]))
    return out
