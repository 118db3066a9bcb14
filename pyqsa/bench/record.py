"""What every `pyqsa bench` result file holds, and its name.

A file is one scenario at one commit: `<date>-<commit>-<scenario>.json` (the names of
bench/results/), a JSON document with
- the run: scenario, utc, date, commit (and whether the tree was dirty), source digest,
  upstream commit, device (backend, GPU name, the devices llama.cpp sees), model, the flags;
- "summary": the scenario's figures, each {"figure", "unit", "median", "min", "max", "n"},
  n being how many measurements (repeats, requests or turns) the median is taken over;
- the scenario's own detail (its records, per-run figures), under keys it documents.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from .meta import git_commit, gpu_name, source_digest, upstream_commit


def device() -> dict[str, Any]:
    """The backend of the loaded library, the GPU's name (nvidia-smi) and llama.cpp's devices."""
    from pyqsa import native

    return {
        "backend": native.build_info().backend,
        "gpu": gpu_name(),
        "devices": [
            {"name": d.name, "description": d.description, "memory_total": d.memory_total}
            for d in native.devices()
        ],
    }


def header(
    scenario: str, model: Path, flags: dict[str, Any], with_device: bool = True
) -> dict[str, Any]:
    """The run's identity (see the module docstring); "device" None without `with_device`
    (asking llama.cpp for its devices' memory opens a CUDA context in this process)."""
    now = time.gmtime()
    return {
        "scenario": scenario,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
        "date": time.strftime("%Y-%m-%d", now),
        **git_commit(),
        "source_digest": source_digest(),
        "upstream_commit": upstream_commit(),
        "device": device() if with_device else None,
        "gpu": gpu_name(),
        "model": model.name,
        "model_bytes": model.stat().st_size,
        "flags": flags,
    }


def figure(name: str, unit: str, values: list[float | None]) -> dict[str, Any]:
    """One summary figure: median and spread (min, max) of the values that exist, and their
    count; all None when none does."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"figure": name, "unit": unit, "median": None, "min": None, "max": None, "n": 0}
    return {
        "figure": name,
        "unit": unit,
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


def file_name(doc: dict[str, Any]) -> str:
    commit = (doc.get("commit") or "nocommit")[:7]
    return f"{doc['date']}-{commit}-{doc['scenario']}.json"


def write(doc: dict[str, Any], folder: Path) -> Path:
    """`doc` as `folder/<date>-<commit>-<scenario>.json`, whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(doc)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path


def fmt(x: float | None) -> str:
    """A figure for the table: 3 significant digits, or more for large numbers."""
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def table(docs: list[dict[str, Any]]) -> str:
    """The summaries of `docs` as one text table, a scenario's rows together."""
    rows = [("scenario", "figure", "median", "min - max", "n", "unit")]
    for doc in docs:
        for f in doc["summary"]:
            spread = f"{fmt(f['min'])} - {fmt(f['max'])}" if f["n"] > 1 else ""
            rows.append(
                (doc["scenario"], f["figure"], fmt(f["median"]), spread, str(f["n"]), f["unit"])
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        pairs = enumerate(zip(r, widths, strict=True))
        cells = [c.rjust(w) if i in (2, 3, 4) else c.ljust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
