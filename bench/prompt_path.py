"""The host time of one /v1/completions request whose prompt is a list of token ids, before the
engine has it: each step on its own, then the whole request through the app (in process, no
socket) up to the return of Engine.submit. No model, no GPU: the engine is not started.

    python bench/prompt_path.py [--tokens 200000] [--repeats 9]

Prints one line per step: the median and the fastest of the repeats, in ms.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit")]

from engine_fakes import FakeRunner, FakeVocab  # noqa: E402

from pyqsa.engine import Engine, EngineConfig, QueueFull, SamplingParams  # noqa: E402
from server.app import create_app  # noqa: E402
from server.chat_template import ChatTemplate  # noqa: E402
from server.json_body import loads  # noqa: E402
from server.protocol import CompletionRequest, token_ids  # noqa: E402
from server.qwen_template import QWEN_TEMPLATE  # noqa: E402

N_VOCAB = 151_936  # Qwen's


class Tokenizer:
    n_vocab = N_VOCAB

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        return list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return b"x"

    def control_tokens(self) -> dict[str, int]:
        return {}


def timed(f: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


def engine(n_tokens: int) -> Engine:
    """Not started: submitted requests wait in its inbox."""
    config = EngineConfig(
        "fake.gguf",
        n_slots=1,
        ctx_per_slot=n_tokens + 1024,
        max_waiting=1 << 20,
        prefix_cache_bytes=1 << 30,
    )
    return Engine(config, FakeRunner(), FakeVocab())


def app_request(body: bytes, n_tokens: int, repeats: int) -> list[float]:
    """The whole request: body read, parsed and validated, prompt checked, Engine.submit; the
    submit is then refused (429) so that the reply does not wait for the engine."""
    eng = engine(n_tokens)
    submitted: list[float] = []
    real_submit = eng.submit

    def submit(*args, **kwargs):
        real_submit(*args, **kwargs)
        submitted.append(time.perf_counter())
        raise QueueFull("measured")

    eng.submit = submit
    app = create_app(eng, Tokenizer(), "m", ChatTemplate(QWEN_TEMPLATE))

    async def run() -> list[float]:
        out = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            headers = {"content-type": "application/json"}
            for _ in range(repeats):
                t = time.perf_counter()
                r = await client.post("/v1/completions", content=body, headers=headers)
                assert r.status_code == 429, r.text
                out.append(submitted[-1] - t)
        return out

    return asyncio.run(run())


@click.command()
@click.option("--tokens", default=200_000, show_default=True)
@click.option("--repeats", default=9, show_default=True)
def main(tokens: int, repeats: int) -> None:
    rng = random.Random(0)
    ids = [rng.randrange(N_VOCAB) for _ in range(tokens)]
    request = {"model": "m", "prompt": ids, "max_tokens": 1}
    body = json.dumps(request).encode()
    parsed = loads(body)
    model = CompletionRequest.model_validate(parsed)
    ids_array = token_ids(model.prompt, N_VOCAB)
    params = SamplingParams(max_tokens=1)
    eng = engine(tokens)

    steps = {
        "client json.dumps": lambda: json.dumps(request).encode(),
        "parse": lambda: loads(body),
        "validate": lambda: CompletionRequest.model_validate(parsed),
        "prompt check": lambda: token_ids(model.prompt, N_VOCAB),
        "Engine.submit": lambda: eng.submit(model.prompt, params, lambda ev: None, ids=ids_array),
    }
    print(f"{tokens} token ids, {len(body)} bytes; median (fastest) of {repeats}, ms")
    for name, f in steps.items():
        times = timed(f, repeats)
        print(f"{name:>20}: {1e3 * statistics.median(times):6.1f} ({1e3 * min(times):.1f})")
    times = app_request(body, tokens, repeats)
    print(f"{'server total':>20}: {1e3 * statistics.median(times):6.1f} ({1e3 * min(times):.1f})")


if __name__ == "__main__":
    main()
