"""Concurrent completions against a running `pyqsa serve`, over HTTP: N requests with token-id
prompts (no template, no tokenizer), each generating exactly --max-tokens tokens (ignore_eos),
and optionally a short request sent --short-after seconds later (an agent's call arriving behind
other users' documents). Per run: each request's time to first token, the short request's, and
the aggregate decode rate while every long request decodes together (tokens streamed between
the last long request's first token and the first one's last token, over that window), with
the engine's step time in that window split into forward pass and host work (its /metrics
counters, read every 0.25 s) and the window's longest wait for a token (a stall of every stream).
One JSON line per run, then a summary line with medians over the runs.

    pyqsa serve MODEL --slots 8 --ctx 36000 &
    python bench/serve_load.py http://127.0.0.1:8000 --requests 8 --prompt-tokens 32000 \\
        --max-tokens 256 --repeats 3
    python bench/serve_load.py http://127.0.0.1:8000 --requests 7 --prompt-tokens 32000 \\
        --max-tokens 32 --short-after 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

import httpx


def completion_body(model: str, prompt: list[int], max_tokens: int) -> dict:
    """A streamed greedy completion of exactly `max_tokens` tokens (ignore_eos), with usage."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
    }


def stream_event(line: str) -> tuple[bool, int | None] | None:
    """One SSE line of a completion stream: (whether it carries text, completion tokens when it
    carries the usage); None for a line that is no event."""
    if not line.startswith("data: {"):
        return None
    event = json.loads(line[len("data: ") :])
    usage = event["usage"]["completion_tokens"] if event.get("usage") else None
    return bool(event["choices"] and event["choices"][0].get("text")), usage


def one(url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    """Streams one completion; the times (perf_counter) of its token chunks and its usage."""
    body = completion_body(model, prompt, max_tokens)
    t0 = time.perf_counter()
    times, usage = [], None
    with httpx.Client(timeout=3600) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            event = stream_event(line)
            if event is None:
                continue
            text, tokens = event
            usage = tokens if tokens is not None else usage
            if text:
                times.append(time.perf_counter())
    return {"t0": t0, "times": times, "completion_tokens": usage}


def together_window(runs: list[dict]) -> tuple[float, float] | None:
    """(start, end) while every run decoded: from the last first token to the first last token;
    None when the runs never all decoded at once."""
    if not runs or any(not r["times"] for r in runs):
        return None
    start = max(r["times"][0] for r in runs)
    end = min(r["times"][-1] for r in runs)
    return (start, end) if end > start else None


def together_rate(runs: list[dict]) -> float | None:
    """Tokens per second streamed in the together window (None without one).

    A token whose text is held back (an incomplete UTF-8 sequence) comes in the next chunk, so
    each run's chunks in the window count as tokens in its ratio of tokens to chunks."""
    window = together_window(runs)
    if window is None:
        return None
    start, end = window
    n = 0.0
    for r in runs:
        per_chunk = (r["completion_tokens"] or len(r["times"])) / len(r["times"])
        n += per_chunk * sum(start < t <= end for t in r["times"])
    return n / (end - start)


def together_longest_gap(runs: list[dict]) -> dict | None:
    """The longest wait for a token in the together window, over all streams at once: its ms and
    when it began (s into the window); None without a window. A step's tokens reach the streams
    within microseconds of each other, so the gaps are the steps, and one far longer than the
    rest is a stall of every stream (work on the engine thread between two passes)."""
    window = together_window(runs)
    if window is None:
        return None
    start, end = window
    times = sorted({start, *(t for r in runs for t in r["times"] if start < t <= end)})
    gap, at = max((b - a, a) for a, b in zip(times, times[1:], strict=False))
    return {"ms": round(1e3 * gap, 2), "at_s": round(at - start, 3)}


# passes that kept the last one's graph; on CUDA, graph computes kernel by kernel, captured into a
# CUDA graph or replayed from one (a window of steady steps replays every pass)
GRAPHS = {
    "reused": "pyqsa_graph_reuses_total",
    **{
        how: f'pyqsa_cuda_graph_computes_total{{how="{how}"}}'
        for how in ("direct", "captured", "replayed")
    },
}
ENGINE_COUNTERS = {
    "pyqsa_engine_steps_total": "steps",
    'pyqsa_engine_step_seconds_total{part="forward"}': "forward",
    'pyqsa_engine_step_seconds_total{part="host"}': "host",
    'pyqsa_engine_step_seconds_total{part="launch"}': "launch",
    # the part of "host" the prefix cache took: snapshots' heads, resumes, restores
    "pyqsa_prefix_cache_engine_seconds_total": "prefix",
    "pyqsa_prefix_cache_snapshots_total": "snapshots",
    "pyqsa_prefix_cache_snapshots_staged_total": "staged",
    # the copier thread's, beside the passes
    "pyqsa_prefix_cache_copy_seconds_total": "copy",
    # how each pass's graph ran (GRAPHS)
    **{name: short for short, name in GRAPHS.items()},
}


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a /metrics page, by name with its labels as written there."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def scrape(url: str) -> dict[str, float]:
    """The server's /metrics samples (parse_metrics)."""
    return parse_metrics(httpx.get(f"{url}/metrics").text)


def engine_counters(url: str) -> dict[str, float]:
    """The engine's step counters from the server's /metrics."""
    return engine_of(scrape(url))


def engine_of(samples: dict[str, float]) -> dict[str, float]:
    """The engine's step counters among a /metrics page's samples, by their short names."""
    return {short: samples[name] for name, short in ENGINE_COUNTERS.items() if name in samples}


class CounterPoller:
    """(perf_counter time, read(url)) every `every` seconds while running; `read` defaults to
    engine_counters."""

    def __init__(self, url: str, every: float = 0.25, read=engine_counters) -> None:
        self.url, self.every, self.read = url, every, read
        self.snapshots: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.snapshots.append((time.perf_counter(), self.read(self.url)))
            self._stop.wait(self.every)

    def __enter__(self) -> CounterPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def engine_in_window(snapshots: list[tuple[float, dict]], window: tuple[float, float] | None):
    """ms per step, its forward and host parts and the launch part of forward (until the pass
    got under way), between the first and last snapshots inside `window`; None without two such
    snapshots a step apart."""
    if window is None:
        return None
    inside = [c for t, c in snapshots if window[0] <= t <= window[1]]
    return engine_between(inside[0], inside[-1]) if len(inside) >= 2 else None


def engine_between(a: dict[str, float], b: dict[str, float]):
    """engine_in_window's figures from two snapshots of engine_counters, `a` before `b`; None
    without a step between them."""
    if b["steps"] <= a["steps"]:
        return None
    steps = b["steps"] - a["steps"]
    forward, host, launch = (1e3 * (b[k] - a[k]) / steps for k in ("forward", "host", "launch"))
    out = {
        "steps": int(steps),
        "forward_ms_per_step": round(forward, 3),
        "host_ms_per_step": round(host, 3),
        "launch_ms_per_step": round(launch, 3),
        "host_share": round(host / (forward + host), 3) if forward + host else None,
    }
    # a server with the prefix cache on: its engine-thread and copier-thread seconds, its heads
    for part in ("prefix", "copy"):
        if part in a and part in b:
            out[f"{part}_ms_per_step"] = round(1e3 * (b[part] - a[part]) / steps, 3)
    for count in ("snapshots", "staged"):
        if count in a and count in b:
            out[count] = int(b[count] - a[count])
    graphs = {k: round((b[k] - a[k]) / steps, 3) for k in GRAPHS if k in a and k in b}
    if graphs:
        out["graphs_per_step"] = graphs
    return out


@dataclass(frozen=True)
class Load:
    """One load against the server at `url`: `requests` prompts of `prompt_tokens` at once,
    `max_tokens` each, optionally a short request `short_after` seconds later; `repeats` runs."""

    url: str
    requests: int = 8
    prompt_tokens: int = 2000
    max_tokens: int = 64
    short_after: float | None = None
    short_prompt_tokens: int = 64
    short_max_tokens: int = 8
    repeats: int = 1
    # the prompts' seed: loads on one server need different ones, or the prefix cache serves one
    # load's prompts from the snapshots of another's
    seed: int = 0


def draw_prompts(args: Load, rng: random.Random) -> tuple[list[list[int]], list[int]]:
    """A run's long prompts and its short one, token ids drawn from `rng`."""

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    return [prompt(args.prompt_tokens) for _ in range(args.requests)], prompt(
        args.short_prompt_tokens
    )


def scenario(args: Load, model: str, rng: random.Random) -> dict:
    prompts, short_prompt = draw_prompts(args, rng)
    short: dict = {}

    def send_short() -> None:
        time.sleep(args.short_after)
        short.update(one(args.url, model, short_prompt, args.short_max_tokens))

    t0 = time.perf_counter()
    waiter = None
    with CounterPoller(args.url) as poller:
        if args.short_after is not None:
            waiter = threading.Thread(target=send_short)
            waiter.start()
        with ThreadPoolExecutor(args.requests) as pool:
            runs = list(pool.map(lambda p: one(args.url, model, p, args.max_tokens), prompts))
        if waiter is not None:
            waiter.join()
    wall = time.perf_counter() - t0

    ttft = [r["times"][0] - r["t0"] for r in runs if r["times"]]
    rate = together_rate(runs)
    tokens = sum(r["completion_tokens"] or 0 for r in runs)
    result = {
        "answered": sum(bool(r["times"]) for r in runs),
        "wall_s": round(wall, 2),
        "ttft_s": sorted(round(t, 3) for t in ttft),
        "together_tok_s": round(rate, 1) if rate is not None else None,
        "together_engine": engine_in_window(poller.snapshots, together_window(runs)),
        "together_longest_gap": together_longest_gap(runs),
        # 1.0: each streamed chunk was one token, so the window's count is exact
        "tokens_per_chunk": round(tokens / max(1, sum(len(r["times"]) for r in runs)), 3),
    }
    if short:
        first = short["times"][0] if short["times"] else None
        result["short_ttft_s"] = round(first - short["t0"], 3) if first is not None else None
        # long requests whose first token came after the short one's
        result["short_first_before_long"] = sum(
            first is not None and bool(r["times"]) and first < r["times"][0] for r in runs
        )
    return result


def window_part(runs: list[dict], part: str) -> list[float | None]:
    """Per run, the ms a step of `part` ("forward", "host", "launch", "prefix", "copy") in the
    window where all decoded together (None where a run had no such window or part)."""
    return [(r["together_engine"] or {}).get(f"{part}_ms_per_step") for r in runs]


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def spread(values: list) -> list:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else []


def measure(load: Load, on_run: Callable[[int, dict], None] | None = None) -> tuple[list, dict]:
    """The load's runs (each as `scenario` gives it; `on_run(index, run)` after each) and their
    summary: medians over the runs, with spread."""
    model = httpx.get(f"{load.url}/v1/models").json()["data"][0]["id"]
    rng = random.Random(load.seed)  # every run's prompts differ: nothing is reused between runs
    runs = []
    for i in range(load.repeats):
        runs.append(scenario(load, model, rng))
        if on_run is not None:
            on_run(i, runs[-1])
    summary = {
        "seed": load.seed,
        "requests": load.requests,
        "prompt_tokens": load.prompt_tokens,
        "max_tokens": load.max_tokens,
        "repeats": load.repeats,
        "answered": min(r["answered"] for r in runs),
        "ttft_median_s": median([statistics.median(r["ttft_s"]) for r in runs if r["ttft_s"]]),
        "ttft_max_s": median([max(r["ttft_s"]) for r in runs if r["ttft_s"]]),
        "together_tok_s": median([r["together_tok_s"] for r in runs]),
        "together_spread": spread([r["together_tok_s"] for r in runs]),
        "tokens_per_chunk": max(r["tokens_per_chunk"] for r in runs),
        "together_longest_gap_ms": median(
            [(r["together_longest_gap"] or {}).get("ms") for r in runs]
        ),
        **{
            f"together_{part}_ms_per_step": median(window_part(runs, part))
            for part in ("host", "forward", "launch", "prefix", "copy")
        },
    }
    if load.short_after is not None:
        summary["short"] = {"after_s": load.short_after, "prompt_tokens": load.short_prompt_tokens}
        summary["short_ttft_s"] = median([r["short_ttft_s"] for r in runs])
        summary["short_ttft_spread"] = spread([r["short_ttft_s"] for r in runs])
    return runs, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--short-after", type=float, help="seconds until the short request is sent")
    ap.add_argument("--short-prompt-tokens", type=int, default=64)
    ap.add_argument("--short-max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--seed", type=int, default=0, help="the prompts' (another for each load on one server)"
    )
    args = ap.parse_args(argv)
    load = Load(**{f.name: getattr(args, f.name) for f in fields(Load)})
    _, summary = measure(load, lambda i, run: print(json.dumps({"run": i, **run}), flush=True))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
