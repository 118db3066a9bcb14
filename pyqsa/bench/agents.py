"""Agents through a running `pyqsa serve`: the prefix cache's scenario. Each of --agents agents
sends its history (--history-tokens: a --shared-tokens prefix common to all of them, a system
prompt and repository dump, then its own tokens), then --turns follow-ups, each its previous
prompt plus --turn-tokens new tokens, as an agent resends its whole context every turn. The
agents run concurrently, each turn after its previous one. Token-id prompts, greedy, exactly
--max-tokens tokens a reply (ignore_eos).

Per turn: time to first token (the first streamed token, and `ttft_text_s` to the first
non-empty text), the prompt tokens the server reports cached
(usage.prompt_tokens_details.cached_tokens) and the reply's token count; with --cold-url (a server
started without the cache: --prefix-cache-gib 0) every reply is checked against that server's
for the same prompt. Concurrent requests round otherwise than one alone (wider passes), so the
replies of agents running together may differ from a cold server's in their last bits
whatever the cache does (prompt chunks computed side by side too, so a follow-up's cached prefix
has such bits); --check-url (a server without the cache) instead runs one more agent once the
others are done, alone, on both servers: its history and follow-ups, each with the same tokens
and logprobs on both. At the end: the prefix cache's /metrics (bytes held, hit and miss tokens,
evictions, starts in place, resumed and restored, the engine thread's seconds on snapshots) and
the device ledger before and after; with --smi (bench/mission.py smi's samples of the server) also
nvidia-smi's figure before and after. One JSON document on stdout (and --out, and with --results
a file <date>-<commit>-prefix.json in that folder).

`combine RUN.json...` makes one record of several runs' (each a server started afresh): the
follow-up figure is the median of the runs' medians, with their spread, each run's summary and
every turn and check tagged with its run.

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
from functools import partial
from itertools import islice
from pathlib import Path

import httpx

from . import mission
from .meta import git_commit, gpu_name, source_digest
from .serve_load import completion_body, scrape
from .smi import smi_changes

FIRST_ID = 100  # prompt token ids from here (below --vocab): clear of the special tokens
PREFIX_METRICS = (
    "pyqsa_prefix_cache_bytes",
    "pyqsa_prefix_cache_hit_tokens_total",
    "pyqsa_prefix_cache_miss_tokens_total",
    "pyqsa_prefix_cache_evicted_total",
    *(
        f'pyqsa_prefix_cache_starts_total{{how="{how}"}}'
        for how in ("continue", "resume", "restore")
    ),
    "pyqsa_prefix_cache_engine_seconds_total",
    "pyqsa_prefix_cache_copy_seconds_total",
)


def turn(
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    logprobs: int = 0,
    on_first: Callable[[], None] = lambda: None,
) -> dict:
    """One streamed greedy completion: its time to first token, to its first text, reply and
    usage (and each token's logprobs: the `logprobs` best of each); `on_first()` once the first
    token came.

    NOTE: logprobs are always asked for (0: the chosen token's alone), so that every token is
    streamed: a chunk whose text is empty (a token that ends inside a UTF-8 character, a control
    token: a random-weight model draws them) is sent only with its logprobs, and the first
    non-empty text may come some decode steps after the first token."""
    body = completion_body(model, prompt, max_tokens) | {"logprobs": logprobs}
    t0 = time.perf_counter()
    ttft, ttft_text, text, usage, lps = None, None, [], None, []
    with httpx.Client(timeout=3600) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: ") :])
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                lp = choice.get("logprobs")
                if ttft is None and lp and lp["tokens"]:
                    ttft = time.perf_counter() - t0
                    on_first()
                if ttft_text is None and choice.get("text"):
                    ttft_text = time.perf_counter() - t0
                text.append(choice.get("text") or "")
                if lp and logprobs:
                    lps.append(lp)
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {
        "ttft_s": ttft,
        "ttft_text_s": ttft_text,
        "reply": "".join(text),
        "completion_tokens": (usage or {}).get("completion_tokens"),
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "logprobs": lps,
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
    check_url: str | None = None
    check_history_tokens: int | None = None  # None: history_tokens
    check_turns: int = 2
    smi: Path | None = None


def model_of(url: str) -> str:
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


def histories(args: Agents, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    shared = [rng.randrange(FIRST_ID, vocab) for _ in range(args.shared_tokens)]
    own = args.history_tokens - args.shared_tokens
    return [
        shared + [rng.randrange(FIRST_ID, vocab) for _ in range(own)] for _ in range(args.agents)
    ]


def follow_ups(args: Agents, index: int, history: list[int]):
    """Agent `index`'s prompts: its history, then each turn's (the previous one and new tokens)."""
    rng = random.Random(args.seed * 1000 + index + 1)
    prompt = list(history)
    while True:
        yield list(prompt)
        prompt += [rng.randrange(FIRST_ID, args.vocab) for _ in range(args.turn_tokens)]


def agent(
    args: Agents,
    model: str,
    index: int,
    history: list[int],
    on_turn: Callable[[], None],
    t0: float,
) -> list:
    """Agent `index`'s turns, each with when it was sent and answered (`sent_s`, `done_s`:
    seconds after `t0`, the run's start on time.perf_counter's clock): the timeline in which
    the agents' turns meet on the server."""
    turns = []
    for k, prompt in enumerate(islice(follow_ups(args, index, history), args.turns + 1)):
        sent = time.perf_counter()
        t = turn(args.url, model, prompt, args.max_tokens)
        t["sent_s"], t["done_s"] = round(sent - t0, 3), round(time.perf_counter() - t0, 3)
        if args.cold_url:
            t["same_as_cold"] = (
                turn(args.cold_url, model, prompt, args.max_tokens)["reply"] == t["reply"]
            )
        kept = {n: v for n, v in t.items() if n not in ("reply", "logprobs")}
        turns.append({"agent": index, "turn": k, **kept})
        on_turn()
    return turns


def divergence(warm: list[dict], cold: list[dict]) -> dict:
    """Where two streams' logprobs (completions chunks) part: the first token that differs (None
    when none does), the largest |logprob difference| of the tokens before it, and each side's
    margin there (its best logprob less its second best): a first difference inside the earlier
    tokens' rounding, where the margin is as small, is a near-tie, not a different state."""

    def flat(chunks: list[dict]) -> list[tuple[str, float, list[float]]]:
        return [
            (t, lp, sorted(top.values(), reverse=True))
            for c in chunks
            for t, lp, top in zip(c["tokens"], c["token_logprobs"], c["top_logprobs"], strict=True)
        ]

    a, b = flat(warm), flat(cold)
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x[0] != y[0]), None)
    same = a[:first] if first is not None else a[: len(b)]
    delta = max((abs(x[1] - y[1]) for x, y in zip(same, b, strict=False)), default=0.0)

    def margin(tops: list[float]) -> float | None:
        return tops[0] - tops[1] if len(tops) > 1 else None

    return {
        "first_difference": first,
        "max_logprob_delta_before": delta,
        "margin_there": None if first is None else margin(a[first][2]),
        "cold_margin_there": None if first is None else margin(b[first][2]),
    }


TIMING = (  # /metrics figures whose change from a turn's start to its first token is reported
    "pyqsa_engine_steps_total",
    'pyqsa_engine_step_seconds_total{part="forward"}',
    'pyqsa_engine_step_seconds_total{part="host"}',
    "pyqsa_prefix_cache_engine_seconds_total",
)


def _scrape_into(out: list[dict], url: str) -> None:
    out.append(scrape(url))


def check(args: Agents, model: str) -> list[dict]:
    """One more agent, alone: its history (check_history_tokens, tokens of its own) and
    check_turns follow-ups, each sent to the server and then to check_url's (no cache). Per
    turn also where the replies part (divergence) and, from the server's /metrics, the passes
    and engine seconds until the first token (`to_first_token`)."""
    rng = random.Random(args.seed + 7919)
    n = args.history_tokens if args.check_history_tokens is None else args.check_history_tokens
    history = [rng.randrange(FIRST_ID, args.vocab) for _ in range(n)]
    out = []
    for k, prompt in enumerate(islice(follow_ups(args, -1, history), args.check_turns + 1)):
        start, at_first = scrape(args.url), []
        on_first = partial(_scrape_into, at_first, args.url)
        warm = turn(args.url, model, prompt, args.max_tokens, 5, on_first)
        mission.wait_idle(args.url)  # its reply computed again, before the next turn
        cold = turn(args.check_url, model, prompt, args.max_tokens, logprobs=5)
        first = at_first[0] if at_first else {}
        out.append(
            {
                "turn": k,
                "prompt_tokens": warm["prompt_tokens"],
                "cached_tokens": warm["cached_tokens"],
                "ttft_s": warm["ttft_s"],
                "cold_ttft_s": cold["ttft_s"],
                "cold_cached_tokens": cold["cached_tokens"],
                "same_tokens": warm["reply"] == cold["reply"],
                "same_logprobs": warm["logprobs"] == cold["logprobs"],
                **divergence(warm["logprobs"], cold["logprobs"]),
                "to_first_token": {
                    k: round(first[k] - start.get(k, 0.0), 6) for k in TIMING if k in first
                },
            }
        )
    return out


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
    device_before = mission.snapshot(args.url, args.smi)
    before = prefix_figures(args.url)
    t0 = time.perf_counter()
    stories = histories(args, args.vocab)
    with ThreadPoolExecutor(args.agents) as pool:
        jobs = [pool.submit(agent, args, model, i, h, on_turn, t0) for i, h in enumerate(stories)]
        turns = [t for j in jobs for t in j.result()]
    wall = time.perf_counter() - t0
    mission.wait_idle(args.url)  # the replies computed again as prompts too
    after = prefix_figures(args.url)
    device_after = mission.snapshot(args.url, args.smi)
    checked = check(args, model) if args.check_url else None
    follow = [t for t in turns if t["turn"] > 0]
    cold = [t for t in turns if t["turn"] == 0]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    record = {
        "scenario": "prefix",
        "note": f"{args.agents} agents, each a {args.history_tokens}-token history then "
        f"{args.turns} follow-ups of {args.turn_tokens} new tokens, through pyqsa serve with the "
        "prefix cache (bench/agents.py).",
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_commit(),
        "source_digest": source_digest(),
        "gpu": gpu_name(),
        "model": model,
        "agents": args.agents,
        "history_tokens": args.history_tokens,
        "shared_tokens": args.shared_tokens,
        "turns": args.turns,
        "turn_tokens": args.turn_tokens,
        "max_tokens": args.max_tokens,
        "wall_s": round(wall, 3),
        "first_turn_ttft_s": med([t["ttft_s"] for t in cold]),
        "follow_up_ttft_s": med([t["ttft_s"] for t in follow]),
        "follow_up_ttft_s_max": max((t["ttft_s"] for t in follow), default=None),
        "follow_up_ttft_text_s": med([t["ttft_text_s"] for t in follow if t["ttft_text_s"]]),
        "ttft_s_by_turn": {
            k: med([t["ttft_s"] for t in turns if t["turn"] == k]) for k in range(args.turns + 1)
        },
        "follow_up_cached_share": med([t["cached_tokens"] / t["prompt_tokens"] for t in follow]),
        "follow_up_cached_tokens": med([t["cached_tokens"] for t in follow]),
        "same_as_cold": all(t["same_as_cold"] for t in turns) if args.cold_url else None,
        "check": checked,
        "host_bytes_held": after["pyqsa_prefix_cache_bytes"],
        "device": {
            "before": device_before,
            "after": device_after,
            "back_to_baseline": mission.compare(device_before, device_after),
            "nvidia_smi_changes": smi_changes(
                args.smi, device_before["unix"], device_after["unix"]
            ),
        },
        "before": before,
        "after": after,
        "turn_records": turns,
    }
    return record


def combine(records: list[dict]) -> dict:
    """One record of runs of the same scenario and commit (see the module's docstring)."""
    keys = ("commit", "model", "agents", "history_tokens", "turns", "turn_tokens", "max_tokens")
    first = records[0]
    for r in records[1:]:
        if any(r[k] != first[k] for k in keys):
            raise ValueError(
                f"runs of another scenario or commit: {[k for k in keys if r[k] != first[k]]}"
            )
    medians = [r["follow_up_ttft_s"] for r in records]
    follow = [t["ttft_s"] for r in records for t in r["turn_records"] if t["turn"] > 0]
    summary = (
        "utc", "wall_s", "first_turn_ttft_s", "follow_up_ttft_s", "follow_up_ttft_s_max",
        "ttft_s_by_turn", "host_bytes_held", "device",
    )  # fmt: skip
    return {
        **first,
        "note": f"{first['note']} {len(records)} runs, each on servers started afresh; "
        "follow_up_ttft_s is the median of the runs' medians.",
        "utc": records[-1]["utc"],
        "runs": [{k: r[k] for k in summary} for r in records],
        "first_turn_ttft_s": statistics.median(r["first_turn_ttft_s"] for r in records),
        "follow_up_ttft_s": statistics.median(medians),
        "follow_up_ttft_s_spread": [min(medians), max(medians)],
        "follow_up_ttft_s_pooled": statistics.median(follow),
        "follow_up_ttft_s_max": max(follow),
        "follow_up_ttft_text_s": statistics.median(r["follow_up_ttft_text_s"] for r in records),
        "ttft_s_by_turn": {
            k: statistics.median(r["ttft_s_by_turn"][k] for r in records)
            for k in first["ttft_s_by_turn"]
        },
        "same_as_cold": None
        if any(r["same_as_cold"] is None for r in records)
        else all(r["same_as_cold"] for r in records),
        "check": [{"run": i, **c} for i, r in enumerate(records) for c in r["check"] or []] or None,
        "device": {
            **records[-1]["device"],
            "back_to_baseline_runs": [r["device"]["back_to_baseline"] for r in records],
        },
        "turn_records": [{"run": i, **t} for i, r in enumerate(records) for t in r["turn_records"]],
    }


def _write(record: dict, results: Path | None, out: Path | None) -> None:
    if results:
        sha = (record["commit"] or "unknown")[:7]
        name = f"{time.strftime('%Y-%m-%d', time.gmtime())}-{sha}-prefix.json"
        results.mkdir(parents=True, exist_ok=True)
        mission.write_json(results / name, record)
        print(f"agents: {results / name}", file=sys.stderr)
    if out:  # last, whole or not at all: tests/gpu/agents.sh waits for it
        mission.write_json(out, record)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["combine"]:
        ap = argparse.ArgumentParser(prog="agents.py combine", description=combine.__doc__)
        ap.add_argument("runs", type=Path, nargs="+", help="the runs' records (--out files)")
        ap.add_argument("--results", type=Path, help="a folder for <date>-<commit>-prefix.json")
        ap.add_argument("--out", type=Path)
        args = ap.parse_args(argv[1:])
        try:
            record = combine([json.loads(p.read_text()) for p in args.runs])
        except (OSError, ValueError, KeyError) as e:
            ap.error(str(e))
        _write(record, args.results, args.out)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--cold-url", help="a server without the prefix cache, for the same replies")
    ap.add_argument(
        "--check-url", help="a server without the prefix cache, for one more agent run alone"
    )
    ap.add_argument(
        "--check-history-tokens", type=int, help="that agent's history (default: --history-tokens)"
    )
    ap.add_argument("--check-turns", type=int, default=2, help="that agent's follow-ups")
    ap.add_argument("--smi", type=Path, help="bench/mission.py smi's samples of the server")
    ap.add_argument("--results", type=Path, help="a folder for <date>-<commit>-prefix.json")
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
    if args.check_history_tokens is not None and args.check_history_tokens < 1:
        ap.error("need check-history-tokens >= 1")
    if args.check_turns < 0:
        ap.error("need check-turns >= 0")
    spec = Agents(**{f.name: getattr(args, f.name) for f in fields(Agents)})
    record = run(spec)
    print(json.dumps(record, indent=1))
    _write(record, args.results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
