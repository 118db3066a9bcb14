"""The recorded result files of bench/results/ as documents, and the ones each figure of the
report is taken from.

A file is named <date>-<commit>[+<commit>...]-<kind>.<ext>. The kinds this module reads:
decode and steps (bench/report.py's and `pyqsa bench`'s decode and prefill documents), serve
and server (server summaries under a list of {"scenario": ...}), mission and long (the long
load's record), capacity (ledger rows), quant (bench/quant_run.sh's rows per file and
variant). Only headline runs count: on a GPU (a document that names no GPU counts, one that
names none does not: a CPU run), on the default full-shape model
(not its small, locality or real-MoE variants); `load(folder, "locality")` reads the locality
model's instead (an indexer that prefers stable blocks, as trained models do), and prefix (the
agents' record).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([0-9a-f+]+)-([a-z-]+)\.([a-z]+)$")
DECODE_KINDS = ("decode", "steps")
SERVE_KINDS = ("serve", "server")
LONG_KINDS = ("mission", "long")
PREFIX_KINDS = ("prefix",)
QUANT_KINDS = ("quant",)
MODEL_TAGS = ("-small", "-locality", "-realmoe")  # in a variant model's file name
MODEL_KINDS = {"random": (), "locality": ("-locality",)}  # the tags of each kind read
CURVE_VARIANTS = ("pyqsa", "pyqsa-paged", "upstream")  # the decode plot's lines
CURVE_SEQS = (1, 8)


@dataclass(frozen=True)
class Doc:
    path: Path
    date: str
    commit: str
    kind: str
    data: dict[str, Any]
    utc: str = ""  # its newest record's time, else that of a file of the same commit and date

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.date, self.utc, self.path.name)

    def cite(self) -> str:
        """Where a figure comes from, for a caption or a table cell."""
        return f"{self.commit}, {self.date}"


def _gpu_and_models(data: dict[str, Any]) -> tuple[Any, list[str]]:
    recs = [r for r in data.get("records") or [] if "kind" in r]
    gpu = data["gpu"] if "gpu" in data else next((r["gpu"] for r in recs if "gpu" in r), "?")
    models = {str(r["model"]) for r in recs if r.get("model")} | {str(data.get("model") or "")}
    for command in (data.get("flags"), data.get("serve_flags")):
        if isinstance(command, str):  # a long load's serve command names the model
            models |= {w for w in command.split() if w.endswith(".gguf")}
    return gpu, sorted(m for m in models if m)


def headline(data: dict[str, Any], model_kind: str = "random") -> bool:
    """A GPU run on the full-shape model of `model_kind` (its tags and no other)."""
    gpu, models = _gpu_and_models(data)
    if gpu is None or data.get("model_kind", model_kind) != model_kind:
        return False
    wanted = MODEL_KINDS[model_kind]
    if not models:  # a document that names no model: taken as the default model's
        return not wanted
    return all({t for t in MODEL_TAGS if t in m} == set(wanted) for m in models)


def newest_utc(data: dict[str, Any]) -> str:
    recs = data.get("records") or []
    return max([str(r.get("utc", "")) for r in recs] + [str(data.get("utc", ""))])


def load(folder: Path, model_kind: str = "random") -> list[Doc]:
    """The headline JSON documents of `folder` on the model of `model_kind`, oldest first (a
    server summary carries no time: it takes that of the decode runs of the same call, which
    share its commit and date)."""
    found = []
    for path in sorted(folder.glob("*.json")):
        m = NAME.match(path.name)
        if m is None:
            continue
        data = json.loads(path.read_text())
        if headline(data, model_kind):
            found.append((path, m.group(1), m.group(2), m.group(3), data, newest_utc(data)))
    times: dict[tuple[str, str], str] = {}
    for _, date, commit, _, _, utc in found:
        times[(date, commit)] = max(times.get((date, commit), ""), utc)
    docs = [Doc(p, d, c, k, data, utc or times[(d, c)]) for p, d, c, k, data, utc in found]
    return sorted(docs, key=lambda d: d.order)


def context_label(n: int) -> str:
    """8192 -> 8K; a count that is no multiple of 1024 as it is (255,000)."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def gpus(docs: list[Doc]) -> list[str]:
    return sorted({str(g) for g, _ in map(_gpu_and_models, (d.data for d in docs)) if g != "?"})


def newest(docs: list[Doc], kinds: tuple[str, ...], ok=lambda doc: True) -> Doc | None:
    found = [d for d in docs if d.kind in kinds and ok(d)]
    return found[-1] if found else None


# -- decode and prefill -----------------------------------------------------------------------


def decode_cell(doc: Doc, variant: str, context: int, n_seq: int) -> dict[str, Any] | None:
    for row in doc.data.get("decode", []):
        if row["context"] == context and row["n_seq"] == n_seq:
            return row.get(variant)
    return None


def prefill_cell(doc: Doc, variant: str, context: int) -> dict[str, Any] | None:
    for row in doc.data.get("prefill", []):
        if row["context"] == context:
            return row.get(variant)
    return None


def curve(doc: Doc, variant: str, n_seq: int) -> list[tuple[int, dict[str, Any]]]:
    """(context, decode cell) of one variant and sequence count, by context."""
    rows = sorted(doc.data.get("decode", []), key=lambda r: r["context"])
    return [(r["context"], r[variant]) for r in rows if r["n_seq"] == n_seq and r.get(variant)]


def decode_source(docs: list[Doc]) -> Doc | None:
    """For the decode plot: of the documents where pyqsa has a curve (two contexts or more) at
    1 and 8 sequences, the one with curves of the most of CURVE_VARIANTS, the newest of those."""

    def curves(doc: Doc) -> int:
        return sum(all(len(curve(doc, v, n)) >= 2 for n in CURVE_SEQS) for v in CURVE_VARIANTS)

    found = [d for d in docs if d.kind in DECODE_KINDS and curves(d) and curve(d, "pyqsa", 1)]
    found = [d for d in found if all(len(curve(d, "pyqsa", n)) >= 2 for n in CURVE_SEQS)]
    return max(found, key=lambda d: (curves(d), d.order), default=None)


# -- device memory ----------------------------------------------------------------------------


def ledger_rows(doc: Doc) -> list[dict[str, Any]]:
    """{"ctx", "seqs", "hot_blocks", "paged", "ledger"} of a capacity document, or of the
    prefill records of a decode document that carry a ledger (pyqsa and pyqsa-paged, f16)."""
    if doc.kind == "capacity":
        return list(doc.data["rows"])
    rows = {}
    for r in doc.data.get("records", []):
        if r.get("kind") == "prefill" and "ledger" in r and r["variant"] in CURVE_VARIANTS[:2]:
            flags = r["flags"]
            key = (r["context"], flags["n_seq_max"], flags.get("hot_blocks", 0))
            rows[key] = {
                "ctx": key[0],
                "seqs": key[1],
                "hot_blocks": key[2],
                "paged": key[2] > 0,
                "ledger": r["ledger"],
            }
    return [rows[k] for k in sorted(rows)]


def memory_rows(doc: Doc) -> list[dict[str, Any]]:
    """The ledger rows at the sequence count with both modes at two contexts or more."""
    rows = ledger_rows(doc)
    for seqs in sorted({r["seqs"] for r in rows}, reverse=True):
        same = [r for r in rows if r["seqs"] == seqs]
        if all(len({r["ctx"] for r in same if r["paged"] == p}) >= 2 for p in (False, True)):
            return same
    return []


def memory_source(docs: list[Doc]) -> Doc | None:
    return newest(docs, ("capacity", *DECODE_KINDS), lambda d: bool(memory_rows(d)))


# -- time to first token ----------------------------------------------------------------------


def serve_scenarios(doc: Doc) -> dict[str, dict[str, Any]]:
    """A server document's summaries by scenario name: the first list of them it holds."""
    for value in doc.data.values():
        if (
            isinstance(value, list)
            and value
            and all(isinstance(s, dict) and "scenario" in s for s in value)
        ):
            return {s["scenario"]: s for s in value}
    return {}


def ttft_source(docs: list[Doc]) -> Doc | None:
    return newest(docs, SERVE_KINDS, lambda d: "idle_ttft" in serve_scenarios(d))


def long_source(docs: list[Doc]) -> Doc | None:
    return newest(docs, LONG_KINDS, lambda d: "unpaged" in d.data and "ttft_s" in d.data)
