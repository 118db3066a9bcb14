"""Agents through a running `pyqsa serve`: the prefix cache's scenario. Each of --agents agents
sends its history (--history-tokens: a --shared-tokens prefix common to all of them, a system
prompt and repository dump, then its own tokens), then --turns follow-ups, each its previous
prompt plus --turn-tokens new tokens, as an agent resends its whole context every turn. The
agents run concurrently, each turn after its previous one. Token-id prompts, greedy, exactly
--max-tokens tokens a reply (ignore_eos).

Per turn: time to first token, the prompt tokens the server reports cached
(usage.prompt_tokens_details.cached_tokens) and the reply's token count; with --cold-url (a server
started without the cache: --prefix-cache-gib 0) every reply is checked against that server's
for the same prompt. At the end: the prefix cache's /metrics (bytes held, hit and miss tokens,
evictions) and the device ledger before and after. One JSON document on stdout (and --out).

    pyqsa serve MODEL --slots 4 --ctx 204800 --kv-offload host &
    python bench/agents.py http://127.0.0.1:8000 --agents 4 --history-tokens 200000 \\
        --shared-tokens 20000 --turns 5 --turn-tokens 500 --out agents.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

import httpx

from .meta import git_commit, gpu_name, source_digest
from .serve_load import completion_body, scrape

FIRST_ID = 100  # prompt token ids from here (below --vocab): clear of the special tokens
PREFIX_METRICS = (
    "pyqsa_prefix_cache_bytes",
    "pyqsa_prefix_cache_hit_tokens_total",
    "pyqsa_prefix_cache_miss_tokens_total",
    "pyqsa_prefix_cache_evicted_total",
)


def turn(url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    """One streamed greedy completion: its time to first token, reply and usage."""
    body = completion_body(model, prompt, max_tokens)
    t0 = time.perf_counter()
    ttft, text, usage = None, [], None
    with httpx.Client(timeout=3600) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: ") :])
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                if ttft is None and choice.get("text"):
                    ttft = time.perf_counter() - t0
                text.append(choice.get("text") or "")
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {
        "ttft_s": ttft,
        "reply": "".join(text),
        "completion_tokens": (usage or {}).get("completion_tokens"),
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
    }


@dataclass(frozen=True)
class Agents:
    """The scenario's shape (the options of main, which the module docstring describes)."""

    url: str
    agents: int = 4
    history_tokens: int = 200_000
    shared_tokens: int = 0
    turns: int = 5
    turn_tokens: int = 500
    max_tokens: int = 32
    vocab: int = 1000
    seed: int = 0
    cold_url: str | None = None


def model_of(url: str) -> str:
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


def histories(args: Agents, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    shared = [rng.randrange(FIRST_ID, vocab) for _ in range(args.shared_tokens)]
    own = args.history_tokens - args.shared_tokens
    return [
        shared + [rng.randrange(FIRST_ID, vocab) for _ in range(own)] for _ in range(args.agents)
    ]


def agent(
    args: Agents, model: str, index: int, history: list[int], on_turn: Callable[[], None]
) -> list:
    rng = random.Random(args.seed * 1000 + index + 1)
    prompt, turns = list(history), []
    for k in range(args.turns + 1):
        if k:
            prompt += [rng.randrange(FIRST_ID, args.vocab) for _ in range(args.turn_tokens)]
        t = turn(args.url, model, prompt, args.max_tokens)
        if args.cold_url:
            t["same_as_cold"] = (
                turn(args.cold_url, model, prompt, args.max_tokens)["reply"] == t["reply"]
            )
        turns.append({"agent": index, "turn": k, **{n: v for n, v in t.items() if n != "reply"}})
        on_turn()
    return turns


def prefix_figures(url: str) -> dict:
    m = scrape(url)
    return {name: m.get(name) for name in PREFIX_METRICS} | {
        "device_ledger_bytes": sum(
            v for k, v in m.items() if k.startswith('pyqsa_ledger_bytes{category="device.')
        )
    }


def run(args: Agents, on_turn: Callable[[], None] = lambda: None) -> dict:
    """Every agent's turns and the record (`on_turn()` after each turn, from its agent's thread)."""
    model = model_of(args.url)
    before = prefix_figures(args.url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.agents) as pool:
        jobs = [
            pool.submit(agent, args, model, i, h, on_turn)
            for i, h in enumerate(histories(args, args.vocab))
        ]
        turns = [t for j in jobs for t in j.result()]
    after = prefix_figures(args.url)
    follow = [t for t in turns if t["turn"] > 0]
    cold = [t for t in turns if t["turn"] == 0]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    record = {
        "scenario": "prefix",
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_commit(),
        "source_digest": source_digest(),
        "gpu": gpu_name(),
        "agents": args.agents,
        "history_tokens": args.history_tokens,
        "shared_tokens": args.shared_tokens,
        "turns": args.turns,
        "turn_tokens": args.turn_tokens,
        "max_tokens": args.max_tokens,
        "wall_s": round(time.perf_counter() - t0, 3),
        "first_turn_ttft_s": med([t["ttft_s"] for t in cold]),
        "follow_up_ttft_s": med([t["ttft_s"] for t in follow]),
        "follow_up_ttft_s_max": max((t["ttft_s"] for t in follow), default=None),
        "follow_up_cached_share": med([t["cached_tokens"] / t["prompt_tokens"] for t in follow]),
        "same_as_cold": all(t["same_as_cold"] for t in turns) if args.cold_url else None,
        "before": before,
        "after": after,
        "turn_records": turns,
    }
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--cold-url", help="a server without the prefix cache, for the same replies")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--history-tokens", type=int, default=200_000)
    ap.add_argument("--shared-tokens", type=int, default=0, help="of the history, common to all")
    ap.add_argument("--turns", type=int, default=5, help="follow-ups after the history")
    ap.add_argument("--turn-tokens", type=int, default=500, help="new tokens a follow-up adds")
    ap.add_argument("--max-tokens", type=int, default=32, help="reply tokens a turn")
    ap.add_argument("--vocab", type=int, default=1000, help="prompt token ids are below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not 0 <= args.shared_tokens <= args.history_tokens or args.agents < 1 or args.turns < 0:
        ap.error("need agents >= 1, turns >= 0 and 0 <= shared-tokens <= history-tokens")
    spec = Agents(**{f.name: getattr(args, f.name) for f in fields(Agents)})
    record = run(spec)
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
