"""capacity: device and host bytes by ledger category of a context of `seqs` sequences, per
context length, unpaged and paged (the model's default hot cache), as the engine opens them
(pyqsa.bench.ledger, in a process of its own; no prefill: the ledger sizes a context at open).

The bytes are exact, not sampled: one reading each (n = 1). The document's "rows" holds every
reading: {"ctx", "seqs", "hot_blocks", "paged", "ledger": {category: bytes}}.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from .. import record
from ..ledger import default_hot_blocks
from . import Bench

SIZES = {
    "quick": {"seqs": 8, "contexts": [1024, 2048, 4096]},
    "cpu": {"seqs": 8, "contexts": [1024, 2048, 4096]},
    "gpu": {"seqs": 8, "contexts": [8192, 32768, 65536, 131072, 262144]},
}
GiB = 2**30


def run(bench: Bench) -> dict[str, Any]:
    size = bench.size(SIZES)
    hot = default_hot_blocks(bench.model)
    rows = []
    with bench.progress(len(size["contexts"]), "capacity", "context") as bar:
        for ctx in size["contexts"]:
            cmd = [sys.executable, "-m", "pyqsa.bench.ledger", str(bench.model)]
            cmd += ["--seqs", str(size["seqs"]), "--ctx", str(ctx)]
            cmd += ["--hot-blocks", ",".join(map(str, hot))]
            with open(bench.work / "capacity.log", "a") as log:
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"ledger.py failed at {ctx}: see {bench.work / 'capacity.log'}")
            for line in proc.stdout.splitlines():
                r = json.loads(line)
                rows.append({**r, "paged": r["hot_blocks"] > 0})
            bar.update()
    doc = record.header("capacity", bench.model, {"preset": bench.preset, **size, "hot": hot})
    doc["summary"] = summary(rows)
    doc["rows"] = rows
    return doc


def totals(ledger: dict[str, int], where: str) -> int:
    """Bytes of every category on `where` ("device" or "host")."""
    return sum(v for k, v in ledger.items() if k.startswith(where + "."))


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device and host GiB per reading; no device rows where nothing is on a device (a CPU)."""
    out = []
    on_device = any(totals(r["ledger"], "device") for r in rows)
    for r in rows:
        mode = f"paged (hot {r['hot_blocks']})" if r["paged"] else "unpaged"
        for where in ("device", "host") if on_device else ("host",):
            name = f"{where}, {mode}, {r['seqs']} x {r['ctx']}"
            out.append(record.figure(name, "GiB", [totals(r["ledger"], where) / GiB]))
    return out
