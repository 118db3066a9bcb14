"""The table of bench/quant_run.sh: per file (the f16 source, each tool's quantized files) and
library variant its size, quantize time, prefill and decode tokens/s per context and sequence
count.

    python bench/quant_report.py quant.jsonl decode.jsonl [--save DIR]

A decode cell is the median over the matching decode.py records (its --repeats), with their
range beside it when there are several; --save also writes
DIR/<date>-<commit>-quant.json (every record and the rows: the file for bench/results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

Rec = dict[str, Any]


def load(path: Path) -> list[Rec]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rows(quant: list[Rec], decode: list[Rec]) -> list[Rec]:
    """One row per model file and variant its decode records name (in their order; one row with
    variant None where it has none): its quantize record (the latest), or the source's for f16.
    A later call that reused the file records no time (seconds null): the earlier call's time
    stays, so the records of several calls (quant.jsonl of each, concatenated) make one table."""
    files: dict[str, Rec] = {}
    for q in quant:
        files.setdefault(q["source"], {"tool": "-", "type": "f16", "bytes": q["source_bytes"]})
        seconds = q["seconds"]
        if seconds is None and q["model"] in files:
            seconds = files[q["model"]].get("quantize_s")
        files[q["model"]] = {"tool": q["tool"], "type": q["type"], "bytes": q["model_bytes"]}
        files[q["model"]]["quantize_s"] = seconds
    out = []
    for name, row in files.items():
        of_file = [r for r in decode if r.get("model") == name]
        variants = list(dict.fromkeys(r.get("variant") for r in of_file)) or [None]
        for variant in variants:
            mine = [r for r in of_file if r.get("variant") == variant]
            out.append({"model": name, "variant": variant, **row, **_cells(mine)})
    return out


def _cells(mine: list[Rec]) -> Rec:
    """The prefill and decode cells of one file's records of one variant."""
    prefill = {r["context"]: r["tok_s"] for r in mine if r["kind"] == "prefill"}  # the latest wins
    steps: dict[tuple[int, int], list[float]] = {}
    for r in mine:
        if r["kind"] == "decode":
            steps.setdefault((r["context"], r["n_seq"]), []).append(r["tok_s"])
    return {
        "prefill_tok_s": prefill,
        "decode_tok_s": {f"{c}x{n}": statistics.median(v) for (c, n), v in steps.items()},
        "decode_spread": {f"{c}x{n}": [min(v), max(v)] for (c, n), v in steps.items()},
        "decode_runs": {f"{c}x{n}": len(v) for (c, n), v in steps.items()},
    }


def _context_seqs(key: str) -> tuple[int, int]:
    c, n = key.split("x")
    return int(c), int(n)


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _cell(row: Rec, key: str) -> str:
    if key not in row["decode_tok_s"]:
        return "-"
    text = f"{row['decode_tok_s'][key]:.1f}"
    if row["decode_runs"][key] > 1:
        lo, hi = row["decode_spread"][key]
        text += f" ({lo:.1f}-{hi:.1f})"
    return text


def render(table: list[Rec]) -> str:
    contexts = sorted({int(c) for r in table for c in r["prefill_tok_s"]})
    cells = sorted({k for r in table for k in r["decode_tok_s"]}, key=_context_seqs)
    head = ["file", "tool", "type", "variant", "GiB", "quantize s"]
    head += [f"prefill {_tokens(c)}" for c in contexts]
    head += [f"decode {n} x {_tokens(c)}" for c, n in map(_context_seqs, cells)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in table:
        q, pre = r.get("quantize_s"), r["prefill_tok_s"]
        vals = [r["model"], r["tool"], r["type"], r["variant"] or "-", f"{r['bytes'] / 2**30:.2f}"]
        vals.append("-" if q is None else f"{q:.0f}")
        vals += [f"{pre[c]:.0f}" if c in pre else "-" for c in contexts]
        vals += [_cell(r, k) for k in cells]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("quant", type=Path)
    ap.add_argument("decode", type=Path)
    ap.add_argument("--save", type=Path, help="folder for <date>-<commit>-quant.json")
    a = ap.parse_args(argv)
    quant, decode = load(a.quant), load(a.decode)
    if not quant:
        print(f"quant_report.py: no records in {a.quant}", file=sys.stderr)
        return 1
    table = rows(quant, decode)
    print(render(table))
    if a.save:
        commit = (quant[-1].get("commit") or "unknown")[:7]
        path = a.save / f"{time.strftime('%Y-%m-%d', time.gmtime())}-{commit}-quant.json"
        note = (
            f"Quantized {quant[-1]['source']} with pyqsa quantize and llama-quantize; "
            "bench/decode.py with pyqsa's library on each file (random weights)."
        )
        doc = {"scenario": "quant", "note": note, "rows": table, "records": quant + decode}
        path.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
