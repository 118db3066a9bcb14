"""Time to first token of one short request at a time on an idle `pyqsa serve`, over HTTP.

Each run streams a completion of a prompt of its own (no prefix cache hit) and times from
sending the request to the first streamed token: median, min and max of the runs after the
warm-up ones, per endpoint (text with a token-id prompt: no template, no tokenizer; chat:
template and tokenizer), and the very first request on its own (on a fresh server: what its
first user waits); the last line is the same as JSON. Start the server first, e.g.

    pyqsa serve --port 8000 --threads 1 &
    python bench/serve_ttft.py http://127.0.0.1:8000 --runs 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import httpx


def ttft(client: httpx.Client, url: str, body: dict) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            if choice.get("text") or choice.get("delta", {}).get("content"):
                return time.perf_counter() - t0
    raise RuntimeError("no token came back")


def request_bodies(model: str, prompt_tokens: int) -> dict[str, tuple[str, Callable]]:
    """Per endpoint, its path and the body of request i: each request a prompt of its own (the
    first token, the chat's first word, differs), so that none is a prefix cache hit."""
    common = {"model": model, "max_tokens": 1, "stream": True, "ignore_eos": True}
    return {
        "text": (
            "/v1/completions",
            lambda i: {**common, "prompt": [1000 + i] + [1000] * (prompt_tokens - 1)},
        ),
        "chat": (
            "/v1/chat/completions",
            lambda i: {
                **common,
                "messages": [{"role": "user", "content": f"{i} " + "hello " * 20}],
            },
        ),
    }


def measure(
    url: str,
    prompt_tokens: int = 32,
    runs: int = 20,
    warmup: int = 3,
    model: str | None = None,
    on_request: Callable[[], None] | None = None,
) -> dict:
    """Per endpoint (text, chat) the median, min and max time to first token of `runs` requests
    after `warmup` ones, in ms, every run's time (`ms`) and the very first request's; calls
    `on_request()` after each request."""
    with httpx.Client(timeout=60) as client:
        model = model or client.get(url + "/v1/models").json()["data"][0]["id"]
        bodies = request_bodies(model, prompt_tokens)
        summary: dict = {"prompt_tokens": prompt_tokens, "runs": runs}
        for name, (path, body) in bodies.items():
            times = []
            for i in range(warmup + runs):
                times.append(ttft(client, url + path, body(i)))
                if on_request is not None:
                    on_request()
            ms = sorted(1e3 * t for t in times[warmup:])
            summary[name] = {
                "ttft_median_ms": round(statistics.median(ms), 1),
                "min_ms": round(ms[0], 1),
                "max_ms": round(ms[-1], 1),
                "first_ms": round(1e3 * times[0], 1),
                "ms": [round(t, 2) for t in ms],
            }
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="server root, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", help="model id (default: the server's first)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    summary = measure(args.url, args.prompt_tokens, args.runs, args.warmup, args.model)
    for name in ("text", "chat"):
        s = summary[name]
        print(
            f"{name}: ttft median {s['ttft_median_ms']:.1f} ms, min {s['min_ms']:.1f}, "
            f"max {s['max_ms']:.1f} ({args.runs} runs; the first request: {s['first_ms']:.1f} ms)"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
