"""Time to first token of one short request at a time on an idle `pyqsa serve`, over HTTP.

Each run streams a completion and times from sending the request to the first streamed
token: median, min and max of the runs after the warm-up ones, per endpoint (text with a
token-id prompt: no template, no tokenizer; chat: template and tokenizer), and the very first
request on its own (on a fresh server: what its first user waits); the last line is the same
as JSON. Start the server first, e.g.

    pyqsa serve --port 8000 --threads 1 &
    python bench/serve_ttft.py http://127.0.0.1:8000 --runs 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="server root, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", help="model id (default: the server's first)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    with httpx.Client(timeout=60) as client:
        model = args.model or client.get(args.url + "/v1/models").json()["data"][0]["id"]
        common = {"model": model, "max_tokens": 1, "stream": True, "ignore_eos": True}
        bodies = {
            "text": ("/v1/completions", {**common, "prompt": [1000] * args.prompt_tokens}),
            "chat": (
                "/v1/chat/completions",
                {**common, "messages": [{"role": "user", "content": "hello " * 20}]},
            ),
        }
        summary = {"prompt_tokens": args.prompt_tokens, "runs": args.runs}
        for name, (path, body) in bodies.items():
            times = [ttft(client, args.url + path, body) for _ in range(args.warmup + args.runs)]
            ms = sorted(1e3 * t for t in times[args.warmup :])
            print(
                f"{name}: ttft median {statistics.median(ms):.1f} ms, "
                f"min {ms[0]:.1f}, max {ms[-1]:.1f} ({args.runs} runs; "
                f"the first request: {1e3 * times[0]:.1f} ms)"
            )
            summary[name] = {
                "ttft_median_ms": round(statistics.median(ms), 1),
                "min_ms": round(ms[0], 1),
                "max_ms": round(ms[-1], 1),
                "first_ms": round(1e3 * times[0], 1),
            }
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
