"""prefix: agents' follow-up turns with the prefix cache (pyqsa.bench.agents), on a server this
scenario starts with the cache and paging: each agent sends its history (a shared part, then its
own), then `turns` follow-ups, each its previous prompt plus `turn_tokens` new tokens. The
figures: time to first token of the first turns and of the follow-ups, and the share of a
follow-up's prompt the server found cached.

The document holds agents.py's record (every turn under "turn_records") besides the summary.
"""

from __future__ import annotations

from typing import Any

from .. import agents, record
from ..serving import served
from . import Bench

SIZES = {
    "quick": {"agents": 2, "history_tokens": 1200, "shared_tokens": 400, "turns": 2,
              "turn_tokens": 60, "max_tokens": 8,
              "serve": "--slots 2 --ctx 2048 --prefix-cache-gib 0.25 --kv-offload host"},
    "cpu": {"agents": 2, "history_tokens": 3000, "shared_tokens": 1000, "turns": 3,
            "turn_tokens": 100, "max_tokens": 16,
            "serve": "--slots 2 --ctx 4096 --prefix-cache-gib 0.5 --kv-offload host"},
    "gpu": {"agents": 4, "history_tokens": 200_000, "shared_tokens": 20_000, "turns": 5,
            "turn_tokens": 500, "max_tokens": 32,
            "serve": "--slots 4 --ctx 204800 --kv-offload host"},
}  # fmt: skip


def run(bench: Bench) -> dict[str, Any]:
    size = bench.size(SIZES)
    flags = [*size["serve"].split(), *bench.thread_flags()]
    shape = {k: v for k, v in size.items() if k != "serve"}
    turns = size["agents"] * (size["turns"] + 1)
    with served(bench.model, flags) as server, bench.progress(turns, "prefix", "turn") as bar:
        rec = agents.run(agents.Agents(server.url, **shape), on_turn=bar.update)
        start_lines = server.start_lines
    doc = record.header("prefix", bench.model, {"preset": bench.preset, **size})
    doc["start_lines"] = start_lines
    doc["summary"] = summary(rec)
    # agents.py's own run fields (commit, gpu, utc) are the header's
    doc |= {k: v for k, v in rec.items() if k not in doc}
    return doc


def summary(rec: dict[str, Any]) -> list[dict[str, Any]]:
    first = [t for t in rec["turn_records"] if t["turn"] == 0]
    follow = [t for t in rec["turn_records"] if t["turn"] > 0]
    return [
        record.figure("first turn TTFT", "s", [t["ttft_s"] for t in first]),
        record.figure("follow-up TTFT", "s", [t["ttft_s"] for t in follow]),
        record.figure(
            "follow-up prompt cached",
            "share",
            [t["cached_tokens"] / t["prompt_tokens"] for t in follow if t["prompt_tokens"]],
        ),
    ]
