"""steps: decode ms a step and tokens/s at 1 and 8 sequences, and prefill tokens/s, per
context, through the C API (pyqsa.bench.decode, one process per run), for pyqsa's library
unpaged and paged (the model's default hot cache) and, given its library, unpatched upstream.

Each (variant, context) runs `repeats` times, each a fresh process, context and prefill (seed =
the repeat's index); the summary gives the median over the runs and their spread. The document
holds what bench/report.py writes (decode and prefill rows, every record) besides the summary.
A run of upstream's library that fails (its dense attention may not fit where pyqsa's does) is
listed under "failed" with its last log line, and upstream runs no longer context; a failing
run of pyqsa's own fails the scenario. With `bench.out`, the document is written after every run
with "partial": {"runs_done", "runs"}, so a run cut short keeps what it measured; the last write
(by the CLI) has no such key.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from pyqsa.engine.paging import QsaKv

from .. import decode_report, record
from . import Bench

SIZES = {
    "quick": {"contexts": [512, 2048], "seqs": [1, 8], "steps": 8, "warmup": 2, "repeats": 3,
              "ubatch": 256},
    "cpu": {"contexts": [1024, 2048, 4096], "seqs": [1, 8], "steps": 16, "warmup": 4,
            "repeats": 3, "ubatch": 512},
    "gpu": {"contexts": [8192, 32768, 131072, 262144], "seqs": [1, 8], "steps": 32, "warmup": 4,
            "repeats": 3, "ubatch": 512},
}  # fmt: skip


def variants(bench: Bench) -> dict[str, list[str]]:
    """Variant -> its decode.py flags."""
    hot = QsaKv.from_gguf(bench.model).default_hot_blocks
    out = {
        "pyqsa": ["--variant", "pyqsa"],
        "pyqsa-paged": ["--variant", "pyqsa", "--hot-blocks", str(hot)],
    }
    if bench.upstream_lib is not None:
        out["upstream"] = ["--variant", "upstream", "--lib", str(bench.upstream_lib)]
    return out


def machine_flags(bench: Bench) -> list[str]:
    """decode.py's flags that follow the machine: threads, and on the CPU no weight repacking."""
    from pyqsa import native

    flags = bench.thread_flags()
    if native.build_info().backend == "CPU":
        # NOTE: the pinned CPU backend's AMX f16 matmul crashes on batches over 5 streams
        flags.append("--no-extra-bufts")
    return flags


def run(bench: Bench) -> dict[str, Any]:
    size = bench.size(SIZES)
    out = bench.work / "steps.jsonl"
    out.unlink(missing_ok=True)
    common = [
        *("--seqs", ",".join(map(str, size["seqs"]))),
        *("--steps", str(size["steps"]), "--warmup", str(size["warmup"])),
        *("--ubatch", str(size["ubatch"]), "--out", str(out)),
        *machine_flags(bench),
    ]
    kinds = variants(bench)
    runs = [
        (name, flags, context, repeat)
        for context in size["contexts"]
        for name, flags in kinds.items()
        for repeat in range(size["repeats"])
    ]
    commands, failed = [], []
    # taken once; the devices only after the runs, so that this process holds no CUDA context
    # (device memory) while decode.py runs
    head = record.header("steps", bench.model, {"preset": bench.preset, **size}, False)
    with bench.progress(len(runs), "steps") as bar:
        for name, flags, context, repeat in runs:
            if not any(f["variant"] == name for f in failed):  # else upstream failed before
                bar.set_postfix_str(f"{name} at {context}")
                cmd = [sys.executable, "-m", "pyqsa.bench.decode", str(bench.model), *flags]
                cmd += [*common, "--contexts", str(context), "--seed", str(repeat)]
                commands.append(" ".join(cmd[1:]))
                reason = decode_run(cmd, bench.work / "steps.log")
                if reason is not None:
                    if name != "upstream":
                        raise RuntimeError(f"decode.py failed ({' '.join(cmd[3:])}): {reason}")
                    failed.append(
                        {"variant": name, "context": context, "repeat": repeat, "reason": reason}
                    )
            bar.update()
            if bench.out is not None:
                doc = document(head, kinds, out, failed, commands)
                record.write(doc | {"partial": {"runs_done": bar.n, "runs": len(runs)}}, bench.out)
    return document(head | {"device": record.device()}, kinds, out, failed, commands)


def document(
    head: dict[str, Any],
    kinds: dict[str, list[str]],
    out: Path,
    failed: list[dict[str, Any]],
    commands: list[str],
) -> dict[str, Any]:
    """The scenario's document (`head`: record.header's) from the records decode.py wrote to
    `out` so far."""
    recs = decode_report.load([out]) if out.exists() else []
    doc = dict(head)
    doc["variants"] = kinds
    doc["decode"] = decode_report.decode_rows(recs)
    doc["prefill"] = decode_report.prefill_rows(recs)
    doc["summary"] = summary(recs) + [
        record.figure(f"{f['variant']} at {f['context']}: failed", "runs", []) for f in failed
    ]
    doc["failed"] = failed
    doc["commands"] = commands
    doc["records"] = recs
    return doc


def decode_run(cmd: list[str], log: Path) -> str | None:
    """Run decode.py; None, or why it failed (the last line it logged)."""
    start = log.stat().st_size if log.exists() else 0
    with open(log, "a") as f:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=f)
    if proc.returncode == 0:
        return None
    with open(log, "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def summary(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decode tokens/s and ms a step per (variant, sequences, context), then prefill tokens/s
    per (variant, context): medians over the runs."""
    out = []
    decode = [r for r in recs if r.get("kind") == "decode"]
    for v, n, c in sorted({(r["variant"], r["n_seq"], r["context"]) for r in decode}):
        same = [r for r in decode if (r["variant"], r["n_seq"], r["context"]) == (v, n, c)]
        out.append(record.figure(f"decode {v}, {n} x {c}", "tok/s", [r["tok_s"] for r in same]))
        ms = [r["step_ms_median"] for r in same]
        out.append(record.figure(f"decode {v}, {n} x {c}", "ms/step", ms))
    prefill = [r for r in recs if r.get("kind") == "prefill"]
    for v, c in sorted({(r["variant"], r["context"]) for r in prefill}):
        same = [r["tok_s"] for r in prefill if (r["variant"], r["context"]) == (v, c)]
        out.append(record.figure(f"prefill {v}, {c}", "tok/s", same))
    return out
