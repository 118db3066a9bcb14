"""The report's plots, PNG through matplotlib's Agg backend, each from recorded documents
(pyqsa.bench.results) and naming the commit and file it shows. The same documents give the
same bytes: no timestamps or version strings in the files, one fixed size and resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from . import results  # noqa: E402
from .results import CURVE_SEQS, CURVE_VARIANTS, Doc  # noqa: E402

GiB = 2**30
SIZE = (8.0, 4.5)  # inches, at DPI: 800 x 450 pixels
DPI = 100
LABEL = {"pyqsa": "pyqsa", "pyqsa-paged": "pyqsa, paged", "upstream": "upstream llama.cpp"}
COLOR = {"pyqsa": "#1f77b4", "pyqsa-paged": "#2ca02c", "upstream": "#d62728"}
STYLE = {1: "--", 8: "-"}
# ledger categories in stacking order (those absent or all zero are left out)
CATEGORIES = (
    "weights",
    "kv",
    "hot",
    "indexer",
    "recurrent",
    "compute",
    "staging",
    "tail",
    "pool",
    "stack",
)


def _context(x: float, _pos: Any = None) -> str:
    return f"{x / 1024:.0f}K" if x >= 1024 else f"{x:.0f}"


def _plain(y: float, _pos: Any = None) -> str:
    return f"{y:g}"


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return path


def _source_note(fig: plt.Figure, docs: list[Doc]) -> None:
    names = ", ".join(d.path.name for d in docs)
    fig.text(0.01, 0.01, f"bench/results/{names}", fontsize=7, color="0.35")


def decode_plot(doc: Doc, path: Path) -> Path:
    """Decode tokens/s against context, per variant at 1 and 8 sequences (median over runs,
    the bars the runs' min and max)."""
    fig, ax = plt.subplots(figsize=SIZE)
    for variant in CURVE_VARIANTS:
        for n in CURVE_SEQS:
            points = results.curve(doc, variant, n)
            if len(points) < 2:
                continue
            xs = [c for c, _ in points]
            ys = [cell["tok_s"] for _, cell in points]
            lo = [cell["tok_s"] - cell.get("tok_s_min", cell["tok_s"]) for _, cell in points]
            hi = [cell.get("tok_s_max", cell["tok_s"]) - cell["tok_s"] for _, cell in points]
            ax.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                color=COLOR[variant],
                linestyle=STYLE[n],
                marker="o",
                capsize=3,
                label=f"{LABEL[variant]}, {n} sequence{'s' if n > 1 else ''}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_context))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.yaxis.set_minor_formatter(FuncFormatter(_plain))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("context (tokens per sequence)")
    ax.set_ylabel("decode tokens/s (all sequences)")
    ax.set_title(f"Decode throughput against context ({doc.cite()})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _source_note(fig, [doc])
    return _save(fig, path)


def memory_plot(doc: Doc, path: Path) -> Path:
    """Device bytes by ledger category against context, unpaged and paged side by side."""
    rows = results.memory_rows(doc)
    contexts = sorted({r["ctx"] for r in rows})
    present = [c for c in CATEGORIES if any(r["ledger"].get(f"device.{c}", 0) for r in rows)]
    fig, ax = plt.subplots(figsize=SIZE)
    width = 0.38
    cmap = plt.get_cmap("tab10")
    totals = []
    for k, paged in enumerate((False, True)):
        mode = {r["ctx"]: r for r in rows if r["paged"] == paged}
        xs = [i + (k - 0.5) * width for i, c in enumerate(contexts) if c in mode]
        bottom = [0.0] * len(xs)
        for j, cat in enumerate(present):
            vals = [mode[c]["ledger"].get(f"device.{cat}", 0) / GiB for c in contexts if c in mode]
            ax.bar(
                xs,
                vals,
                width,
                bottom=bottom,
                color=cmap(j),
                edgecolor="black" if paged else "white",
                label=cat if k == 0 else None,
            )
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        totals += bottom
        for x, total in zip(xs, bottom, strict=True):
            ax.text(x, total, f"{'paged' if paged else 'unpaged'}\n{total:.1f}", ha="center",
                    va="bottom", fontsize=7)  # fmt: skip
    seqs = rows[0]["seqs"]
    hot = max(r["hot_blocks"] for r in rows)
    ax.set_xticks(range(len(contexts)), [f"{seqs} x {_context(c)}" for c in contexts])
    ax.set_xlabel(f"sequences x context; paged: {hot} hot blocks a sequence and QSA layer")
    ax.set_ylabel("device memory (GiB, the ledger)")
    ax.set_title(f"Device memory by category, unpaged and paged ({doc.cite()})")
    if max(totals, default=0) > 0:  # (a CPU run's device holds nothing)
        ax.set_ylim(0, 1.2 * max(totals))
        ax.legend(fontsize=8, ncol=2, loc="upper left")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _source_note(fig, [doc])
    return _save(fig, path)


def ttft_rows(serve: Doc | None, long: Doc | None) -> list[tuple[str, list[float], tuple]]:
    """(label, samples in s, (median, min, max) where only a summary was kept) per row."""
    out: list[tuple[str, list[float], tuple]] = []
    if serve is not None:
        by = results.serve_scenarios(serve)
        idle = by["idle_ttft"]
        text = idle["text"]
        label = f"idle, {idle['prompt_tokens']}-token prompt ({serve.commit})"
        samples = [ms / 1e3 for ms in text.get("ms", [])]
        summary = (text["ttft_median_ms"] / 1e3, text["min_ms"] / 1e3, text["max_ms"] / 1e3)
        out.append((label, samples, () if samples else summary))
        short = by.get("short_behind_long")
        if short and short.get("short_ttft_s") is not None:
            lo, hi = short["short_ttft_spread"]
            behind = f"{short['requests']} x {results.context_label(short['prompt_tokens'])}"
            short_tokens = short["short"]["prompt_tokens"]
            label = f"{short_tokens}-token request behind {behind} ({serve.commit})"
            out.append((label, [], (short["short_ttft_s"], lo, hi)))
    if long is not None:
        n, p = long.data["requests"], results.context_label(long.data["prompt_tokens"])
        for which, figs in (("paged", long.data), ("unpaged", long.data["unpaged"])):
            samples = [t for t in figs["ttft_s"] if t is not None]
            out.append((f"{n} x {p} at once, {which} ({long.commit})", samples, ()))
    return out


def ttft_plot(serve: Doc | None, long: Doc | None, path: Path) -> Path:
    """Time to first token: every request's as a dot, a summary's median and spread as a bar."""
    rows = ttft_rows(serve, long)
    fig, ax = plt.subplots(figsize=SIZE)
    for i, (_, samples, summary) in enumerate(rows):
        if samples:
            ax.plot(samples, [i] * len(samples), "o", color="#1f77b4", alpha=0.6)
        if summary:
            med, lo, hi = summary
            ax.errorbar([med], [i], xerr=[[med - lo], [hi - med]], fmt="D", color="#d62728",
                        capsize=4)  # fmt: skip
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s); dots: requests, diamonds: median and spread of runs")
    ax.set_title("Time to first token")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _source_note(fig, [d for d in (serve, long) if d is not None])
    return _save(fig, path)
