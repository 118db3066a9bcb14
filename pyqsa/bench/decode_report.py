"""Tables from decode.py's JSON lines, and the results file under bench/results/.

    python bench/report.py decode.jsonl [more.jsonl ...] [--commands commands.txt ...]
        [--note TEXT] [--no-save]
    python bench/report.py bench/results/<date>-<commit>-decode.json --no-save   # a saved run again

Decode speed and prefill are separate sections and never combined into one figure. Each cell
is one run's median over its timed steps; when a (variant, context, sequences) was measured
more than once, the latest run is shown and the count given. Writes
bench/results/<date of the newest record>-<commit>-decode.json with every record, the tables'
rows and the commands, unless --no-save.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from .meta import RESULTS

# pyqsa-paged: decode.py --hot-blocks; pyqsa-paged-q8: the same with --kv-type q8_0;
# pyqsa-paged-q8f16: --kv-type q8_0 --kv-hot-type f16 (a q8_0 store under an f16 hot cache);
# pyqsa-sampled: decode.py --sampling device; pyqsa-cores: PYQSA_QSA_ATTN_MMA=0 (qsa_attn on CUDA
# cores, not tensor cores; up to ad5033e only prefill chunks took tensor cores); pyqsa-mmadec
# (ad5033e's results only: PYQSA_QSA_ATTN_MMA=1 put decode steps on tensor cores, the default
# after); pyqsa-moesync: PYQSA_CUDA_MOE_SYNC=1 (MoE products on
# upstream's host-sorted path); pyqsa-f16acc: PYQSA_CUDA_F16_ACCUMULATE=1 (f16 products on cuBLAS
# and MMVF summed in f16, as upstream's); pyqsa-gdnup: PYQSA_CUDA_GDN_UPSTREAM=1 (the gated delta
# rule on upstream's kernel); pyqsa-moemmf: PYQSA_CUDA_MOE_MMF=1 (MoE products of every batch on
# MMF, not pyqsa's grouped GEMM); pyqsa-gemvup: PYQSA_CUDA_GEMV_UPSTREAM=1 (decode products of 1-8
# columns on upstream's MMVF/MMF, not pyqsa's gemv); pyqsa-hcunf: PYQSA_HC_UNFUSED=1 (the
# hyper-connection combine and gate as upstream's ops, not pyqsa's hc_combine and silu_scaled);
# pyqsa-ungrp: PYQSA_CUDA_PRODUCTS_UNGROUPED=1 (a decode step's products of one x a launch each,
# not grouped into one); pyqsa-gatesunf: PYQSA_GATES_UNFUSED=1 (the linear attention's gates and
# the shared expert's gated join as upstream's ops, not pyqsa's gdn_gates and add_gated);
# pyqsa-topk1: PYQSA_CUDA_TOPK_ONE_CTA=1 (a decode step's top-k rows on one CTA each, not over a
# thread-block cluster); pyqsa-hcmixunf: PYQSA_HC_MIX_UNFUSED=1 (a decode step's hyper-connection
# mixes as upstream's ops, not pyqsa's hc_down and hc_pre); pyqsa-combapart:
# PYQSA_CUDA_HC_COMBINE_APART=1 (each combine of hyper-connections a launch of its own, not inside
# the next mix's hc_down); pyqsa-mix8: PYQSA_HC_MIX_TOKENS=8 (the mixes of steps of up to 8 tokens
# as hc_down and hc_pre, not only one-token steps); pyqsa-gdnconvapart: PYQSA_CUDA_GDN_CONV_APART=1
# (a decode step's gdn_gates a launch of its own, not inside conv_step's); pyqsa-joinunf:
# PYQSA_HC_JOIN_UNFUSED=1 (the MoE's gated join an op of its own, not inside the combine after it);
# pyqsa-inputsync: PYQSA_SCHED_INPUTS_SYNC=1 (each host input of a step copied by upstream's
# synchronous set, not queued from a pinned stage); pyqsa-chunk1: PYQSA_CUDA_GEMV_ONE_CHUNK=1
# (q4_K's, q5_K's and q6_K's decode products one 8-weight chunk a lane-step, not 2 or 4 from
# about one chunk's loads); pyqsa-fastoff: every switch of the decode fast
# path together (decode.FAST_PATH_OFF: upstream's decode products, ungrouped, the hyper-connection,
# gate and mix ops unfused, the top-k on one CTA a row, the inputs copied synchronously)
VARIANTS = (
    "pyqsa",
    "upstream",
    "pyqsa-paged",
    "pyqsa-paged-q8",
    "pyqsa-paged-q8f16",
    "pyqsa-sampled",
    "pyqsa-cores",
    "pyqsa-mmadec",
    "pyqsa-moesync",
    "pyqsa-f16acc",
    "pyqsa-gdnup",
    "pyqsa-moemmf",
    "pyqsa-gemvup",
    "pyqsa-hcunf",
    "pyqsa-ungrp",
    "pyqsa-gatesunf",
    "pyqsa-topk1",
    "pyqsa-hcmixunf",
    "pyqsa-combapart",
    "pyqsa-mix8",
    "pyqsa-gdnconvapart",
    "pyqsa-joinunf",
    "pyqsa-inputsync",
    "pyqsa-chunk1",
    "pyqsa-fastoff",
)
SHORT = {
    "pyqsa": "pyqsa",
    "upstream": "upstr",
    "pyqsa-paged": "paged",
    "pyqsa-paged-q8": "pgdq8",
    "pyqsa-paged-q8f16": "pq8hf",
    "pyqsa-sampled": "smpld",
    "pyqsa-cores": "cores",
    "pyqsa-mmadec": "mmadc",
    "pyqsa-moesync": "mosyn",
    "pyqsa-f16acc": "f16ac",
    "pyqsa-gdnup": "gdnup",
    "pyqsa-moemmf": "moemf",
    "pyqsa-gemvup": "gemvu",
    "pyqsa-hcunf": "hcunf",
    "pyqsa-ungrp": "ungrp",
    "pyqsa-gatesunf": "gatun",
    "pyqsa-topk1": "topk1",
    "pyqsa-hcmixunf": "hcmix",
    "pyqsa-combapart": "cmbap",
    "pyqsa-mix8": "mix8",
    "pyqsa-gdnconvapart": "gcvap",
    "pyqsa-joinunf": "joinu",
    "pyqsa-inputsync": "insyn",
    "pyqsa-chunk1": "chnk1",
    "pyqsa-fastoff": "fstof",
}
# the paged variants, each compared with pyqsa's unpaged f16 runs: (variant, ratio key, label)
PAGED = (
    ("pyqsa-paged", "paged_over_pyqsa", "paged/pyqsa"),
    ("pyqsa-paged-q8", "paged_q8_over_pyqsa", "pgdq8/pyqsa"),
    ("pyqsa-paged-q8f16", "paged_q8f16_over_pyqsa", "pq8hf/pyqsa"),
)
Rec = dict[str, Any]


class NotRecords(ValueError):
    """A file that holds no decode.py records."""


def records_of(path: Path) -> list[Rec]:
    """decode.py's records in `path`: its JSON lines, or the `records` of a results file this
    script wrote (so a saved run's tables can be printed again)."""
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("records"), list):
        return doc["records"]
    recs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict):
            raise NotRecords(
                f"{path}, line {n}: not a decode.py record (JSON lines from decode.py --out, or "
                "a results file of bench/report.py)"
            )
        recs.append(rec)
    return recs


def load(paths: list[Path]) -> list[Rec]:
    recs = [r for p in paths for r in records_of(p)]
    return sorted(recs, key=lambda r: r.get("utc", ""))


def latest(recs: list[Rec], kind: str) -> tuple[dict[tuple, Rec], dict[tuple, list[Rec]]]:
    """(variant, context[, n_seq]) -> newest record of the kind, and the records of that key
    from the newest one's commit (the runs a median is taken over)."""
    out: dict[tuple, Rec] = {}
    runs: dict[tuple, list[Rec]] = {}
    for r in recs:
        if r.get("kind") != kind:
            continue
        key = (r["variant"], r["context"]) + ((r["n_seq"],) if kind == "decode" else ())
        out[key] = r
        runs.setdefault(key, []).append(r)
    for key, r in out.items():
        runs[key] = [x for x in runs[key] if x.get("commit") == r.get("commit")]
    return out, runs


def _median_of(runs: list[Rec], field: str) -> dict[str, float]:
    """The median of a field over runs, with its spread."""
    xs = [x[field] for x in runs]
    return {field: statistics.median(xs), f"{field}_min": min(xs), f"{field}_max": max(xs)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def decode_rows(recs: list[Rec]) -> list[Rec]:
    by, runs = latest(recs, "decode")
    rows = []
    for ctx, n in sorted({(k[1], k[2]) for k in by}):
        row: Rec = {"context": ctx, "n_seq": n}
        for v in VARIANTS:
            r = by.get((v, ctx, n))
            row[v] = (
                None
                if r is None
                else {
                    **_median_of(runs[(v, ctx, n)], "tok_s"),
                    **_median_of(runs[(v, ctx, n)], "step_ms_median"),
                    "pos_start": r["pos_start"],
                    "runs": len(runs[(v, ctx, n)]),
                    **({"paging_per_step": r["paging_per_step"]} if "paging_per_step" in r else {}),
                }
            )
            # decode time per step against this variant's smallest measured context
            base = min((k[1] for k in by if k[0] == v and k[2] == n), default=None)
            if r is not None and base is not None:
                row[v]["step_vs_smallest"] = row[v]["step_ms_median"] / statistics.median(
                    x["step_ms_median"] for x in runs[(v, base, n)]
                )
                row[v]["smallest_context"] = base
        _ratios(row)
        _floor(row, [by[k] for k in by if k[1:] == (ctx, n)])
        rows.append(row)
    return rows


def _floor(row: Rec, recs: list[Rec]) -> None:
    """The step's weight floor (decode.py's weight_floor_ms) and each variant's step over it."""
    floor = next((r["weight_floor_ms"] for r in recs if r.get("weight_floor_ms")), None)
    row["weight_bytes"] = next((r["weight_bytes"] for r in recs if "weight_bytes" in r), None)
    row["weight_floor_ms"] = floor
    for v in VARIANTS:
        if row[v] and floor:
            row[v]["step_over_floor"] = row[v]["step_ms_median"] / floor


def _ratios(row: Rec) -> None:
    tok = {v: row[v]["tok_s"] if row[v] else None for v in VARIANTS}
    row["pyqsa_over_upstream"] = _ratio(tok["pyqsa"], tok["upstream"])
    for v, key, _ in PAGED:
        row[key] = _ratio(tok[v], tok["pyqsa"])


def prefill_rows(recs: list[Rec]) -> list[Rec]:
    by, runs = latest(recs, "prefill")
    rows = []
    for ctx in sorted({k[1] for k in by}):
        row: Rec = {"context": ctx}
        for v in VARIANTS:
            r = by.get((v, ctx))
            row[v] = (
                None
                if r is None
                else {
                    **_median_of(runs[(v, ctx)], "tok_s"),
                    **_median_of(runs[(v, ctx)], "seconds"),
                    "tokens": r["tokens"],
                    "runs": len(runs[(v, ctx)]),
                }
            )
        _ratios(row)
        rows.append(row)
    return rows


def print_tables(recs: list[Rec], dec: list[Rec], pre: list[Rec]) -> None:
    w = sys.stdout.write
    shown = [v for v in VARIANTS if any(r[v] for r in dec + pre)]
    paged = [(key, label) for v, key, label in PAGED if v in shown]
    paged_head = "".join(f" | {label:>11}" for _, label in paged) + "\n"

    def paged_cells(r: Rec) -> str:
        return "".join(f" | {_fmt(r[key], '.2f'):>11}" for key, _ in paged) + "\n"

    w("## Decode (one token per sequence per step; median step of each run, median over runs)\n")
    head = " | ".join(f"{SHORT[v] + ' tok/s':>11} {'ms/step':>8} {'x@min':>5}" for v in shown)
    w(f"{'context':>8} {'seqs':>4} | {head} | {'pyqsa/upstr':>11}{paged_head}")
    for r in dec:
        cells = []
        for v in shown:
            c = r[v] or {}
            cells.append(
                f"{_fmt(c.get('tok_s')):>11} {_fmt(c.get('step_ms_median'), '.2f'):>8} "
                f"{_fmt(c.get('step_vs_smallest'), '.2f'):>5}"
            )
        w(f"{r['context']:>8} {r['n_seq']:>4} | {' | '.join(cells)} | ")
        w(f"{_fmt(r['pyqsa_over_upstream'], '.2f'):>11}{paged_cells(r)}")
    w("  x@min: this step time over the same variant's at its smallest measured context\n")
    for r in dec:
        if r.get("weight_floor_ms"):
            over = ", ".join(f"{SHORT[v]} {r[v]['step_over_floor']:.2f}x" for v in shown if r[v])
            w(
                f"  weight floor {r['context']} x {r['n_seq']}: {r['weight_bytes'] / 1e9:.2f} GB "
                f"a step, {r['weight_floor_ms']:.2f} ms at the GPU's nominal bandwidth; {over}\n"
            )
    for r in dec:
        for v in shown:
            c = r[v]
            if c and c["runs"] > 1:
                w(
                    f"  {SHORT[v]} {r['context']} x {r['n_seq']}: {c['runs']} runs, "
                    f"{c['step_ms_median_min']:.2f}-{c['step_ms_median_max']:.2f} ms/step\n"
                )
    for r in dec:
        for v, _, _ in PAGED:
            p = (r.get(v) or {}).get("paging_per_step")
            if not p:
                continue
            hit = p["hits"] / (p["hits"] + p["misses"]) if p["hits"] + p["misses"] else None
            w(
                f"  {SHORT[v]} {r['context']} x {r['n_seq']}: per step {p['hits']:.0f} hits, "
                f"{p['misses']:.0f} misses (hit rate {_fmt(hit, '.3f')}), "
                f"{p['bytes_to_device'] / 2**20:.1f} MiB to the device, "
                f"{p['bytes_to_host'] / 2**10:.1f} KiB to the host\n"
            )
    w("\n## Prefill (sequence 0, random tokens)\n")
    head = " | ".join(f"{SHORT[v] + ' tok/s':>11} {'s':>7}" for v in shown)
    w(f"{'context':>8} | {head} | {'pyqsa/upstr':>11}{paged_head}")
    for r in pre:
        cells = [
            f"{_fmt((r[v] or {}).get('tok_s')):>11} {_fmt((r[v] or {}).get('seconds')):>7}"
            for v in shown
        ]
        w(f"{r['context']:>8} | {' | '.join(cells)} | {_fmt(r['pyqsa_over_upstream'], '.2f'):>11}")
        w(paged_cells(r))
    ran = {(r["variant"], r["context"]) for r in recs if r.get("kind") == "prefill"}
    skipped = [
        r for r in recs if r.get("kind") == "skipped" and (r["variant"], r["context"]) not in ran
    ]
    if skipped:
        w("\n## Not run\n")
        for r in skipped:
            w(
                f"{r['variant']} at {r['context']}: {r['reason']} (prefill estimate "
                f"{r.get('estimated_prefill_s')} s)\n"
            )
    w("\n## Runs\n")
    keys = ("commit", "dirty", "source_digest", "upstream_commit", "gpu", "pyqsa_version", "model")
    for key in keys:
        w(f"{key}: {sorted({str(r.get(key)) for r in recs if key in r})}\n")
    dec_recs = [r for r in recs if r.get("kind") == "decode"]
    w(f"env: {sorted({json.dumps(r['env']) for r in recs if 'env' in r})}\n")
    # n_ctx is context * n_seq_max in every run; the other flags must agree across runs
    flags = {json.dumps({**r["flags"], "n_ctx": None}, sort_keys=True) for r in dec_recs}
    w(f"flags (n_ctx = context * n_seq_max): {sorted(flags)}\n")
    # runs with --sampling device bring back drawn tokens, not logits
    host = [r for r in dec_recs if "logits_finite" in r]
    device = [r for r in dec_recs if "drawn_in_vocab" in r]
    finite = all(r["logits_finite"] for r in host)
    # a later repeat decodes copies that earlier repeats' random tokens made differ
    fresh = [r for r in host if "copy_max_abs_diff" in r and r.get("repeat", 0) == 0]
    diff = max((r["copy_max_abs_diff"] for r in fresh), default=None)
    w(
        f"checks: logits finite in every run: {finite}; copied sequences vs sequence 0, "
        f"max |logit diff|: {diff}\n"
    )
    if device:
        same = all(r.get("copy_tokens_equal", True) for r in device)
        in_vocab = all(r["drawn_in_vocab"] for r in device)
        w(
            f"checks, --sampling device: tokens in the vocabulary: {in_vocab}; copies drew "
            f"sequence 0's token: {same}\n"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument(
        "--commands",
        type=Path,
        nargs="*",
        default=[],
        help="the commands.txt files of the runs (kept in the results file)",
    )
    ap.add_argument("--note", default="", help="a remark kept in the results file")
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args(argv)
    try:
        recs = load(args.files)
    except (OSError, NotRecords) as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    if not recs:
        print("no records", file=sys.stderr)
        return 1
    dec, pre = decode_rows(recs), prefill_rows(recs)
    print_tables(recs, dec, pre)
    if args.no_save:
        return 0
    date = recs[-1].get("utc", "")[:10] or "undated"
    commits = sorted({str(r.get("commit", ""))[:7] for r in recs if r.get("commit")})
    out = RESULTS / f"{date}-{'+'.join(commits) or 'nocommit'}-decode.json"
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "note": args.note,
        "decode": dec,
        "prefill": pre,
        "commands": [line for p in args.commands for line in p.read_text().splitlines()],
        "records": recs,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
