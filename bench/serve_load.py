"""N concurrent completions against a running `pyqsa serve`, over HTTP: each request a token-id
prompt (no template, no tokenizer) and a fixed number of generated tokens; per request its time
to first token, its total time and tokens, and the aggregate decode rate. One JSON line.

    pyqsa serve MODEL --slots 8 --ctx 262144 &
    python bench/serve_load.py http://127.0.0.1:8000 --requests 8 --prompt-tokens 2000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def one(url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
    }
    t0 = time.perf_counter()
    first, n = None, 0
    with httpx.Client(timeout=3600) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if json.loads(line[len("data: ") :])["choices"][0].get("text") is not None:
                first = first or time.perf_counter() - t0
                n += 1
    return {"ttft_s": first, "total_s": time.perf_counter() - t0, "chunks": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    model = httpx.get(f"{args.url}/v1/models").json()["data"][0]["id"]
    rng = random.Random(0)
    prompts = [
        [rng.randrange(100, 5000) for _ in range(args.prompt_tokens)] for _ in range(args.requests)
    ]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.requests) as pool:
        runs = list(pool.map(lambda p: one(args.url, model, p, args.max_tokens), prompts))
    wall = time.perf_counter() - t0
    ttft = [r["ttft_s"] for r in runs if r["ttft_s"] is not None]
    print(
        json.dumps(
            {
                "requests": args.requests,
                "prompt_tokens": args.prompt_tokens,
                "max_tokens": args.max_tokens,
                "answered": sum(r["chunks"] > 0 for r in runs),
                "wall_s": round(wall, 2),
                "ttft_s": {"median": round(statistics.median(ttft), 3), "max": round(max(ttft), 3)}
                if ttft
                else None,
                "chunks": [r["chunks"] for r in runs],
                "total_s": [round(r["total_s"], 2) for r in runs],
            }
        )
    )


if __name__ == "__main__":
    main()
