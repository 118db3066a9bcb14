"""GPU kernel time by kernel name over a stretch of a benchmark: CUPTI through PyTorch's profiler,
which records every CUDA kernel the process launches, llama.cpp's and pyqsa's included. The
profiler adds launch overhead, so a profiled stretch is never a timed one.

    with KernelProfile() as kp:
        ...                      # llama_decode calls, synchronized before the block ends
    rows = kp.rows               # [(name, calls, total_us)], largest total first
    print(table("decode, 8 x 32K, 32 steps", rows, per=32))
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any


def kernel_totals(trace: dict[str, Any]) -> list[tuple[str, int, float]]:
    """(name, calls, total microseconds) of the kernels of a Chrome trace (the profiler's
    export: events of category "kernel" with a duration), largest total first."""
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") == "kernel" and "dur" in ev:
            calls[ev["name"]] += 1
            total[ev["name"]] += float(ev["dur"])
    return sorted(((n, calls[n], total[n]) for n in total), key=lambda r: (-r[2], r[0]))


def table(title: str, rows: list[tuple[str, int, float]], per: int = 1, top: int = 30) -> str:
    """The rows as text: the launches per `per` (steps or chunks) of the stretch, each kernel's
    share of all kernel time, and its time and calls per `per`."""
    all_us = sum(r[2] for r in rows)
    launches = sum(r[1] for r in rows) / per
    out = [
        f"## {title}: {all_us / per / 1e3:.3f} ms of kernels per step, {launches:.1f} launches "
        f"of {len(rows)} kernels"
    ]
    out.append(f"{'share':>6} {'ms/step':>9} {'calls/step':>10}  kernel")
    for name, calls, us in rows[:top]:
        share = us / all_us if all_us else 0.0
        out.append(f"{share:6.1%} {us / per / 1e3:9.3f} {calls / per:10.1f}  {name[:110]}")
    if len(rows) > top:
        rest = sum(r[2] for r in rows[top:])
        out.append(
            f"{rest / all_us:6.1%} {rest / per / 1e3:9.3f} {'':>10}  ({len(rows) - top} more)"
        )
    return "\n".join(out)


def require_kernel_profiler() -> None:
    """Raises RuntimeError unless this PyTorch can record CUDA kernels."""
    try:
        from torch.profiler import ProfilerActivity, supported_activities
    except ImportError:
        raise RuntimeError("profiling kernels needs PyTorch (with CUDA)") from None
    if ProfilerActivity.CUDA not in supported_activities():
        raise RuntimeError("this PyTorch cannot record CUDA kernels (a CPU-only build?)")


class KernelProfile:
    """Records CUDA kernels while the block runs; `rows` afterwards (kernel_totals)."""

    def __enter__(self) -> KernelProfile:
        from torch.profiler import ProfilerActivity, profile

        require_kernel_profiler()
        self._prof = profile(activities=[ProfilerActivity.CUDA])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "trace.json"
            self._prof.export_chrome_trace(str(path))
            self.rows = kernel_totals(json.loads(path.read_text()))
