"""Prefill policy through the server: a short request sent behind long prompts gets its first
token before them (fair), or after the oldest of them (fcfs). Orderings, not timings."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from conftest import THREADS, start_server, stop_server

N_LONG = 3
# tokens: with an 8-token step budget the long prompts take ~360 steps together, far more than
# the short request's trip through HTTP (at 32 tokens, ~45 quick CPU steps sometimes were not),
# and under fcfs the oldest alone takes 120, more than the other two need to be admitted (at 480
# tokens, 60 steps, the oldest once had its first token before the third was in)
LONG = 960
SHORT = 5


@pytest.fixture(scope="module", params=["fair", "fcfs"])
def policy_server(request, demo_gguf, cache_dir):
    s = start_server(
        [str(demo_gguf), "--slots", "4", "--ctx", "1024", "--batch-tokens", "8"]
        + ["--prefill-policy", request.param, *THREADS],
        cache_dir,
    )
    yield request.param, s
    stop_server(s)


def first_token_at(server, prompt: list[int], out: dict, key: str) -> None:
    """Stream a completion of token ids; note when its first token arrives."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and '"text"' in line:
                out.setdefault(key, time.monotonic())


def test_a_short_request_behind_long_prompts(policy_server):
    policy, server = policy_server
    first: dict[str, float] = {}
    longs = [
        threading.Thread(target=first_token_at, args=(server, [1000 + i] * LONG, first, f"l{i}"))
        for i in range(N_LONG)
    ]
    for t in longs:
        t.start()
    deadline = time.monotonic() + 30
    while server.metrics()["pyqsa_busy_slots"] < N_LONG:  # the long prompts are prefilling
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert not first  # still prefilling
    first_token_at(server, [2000] * SHORT, first, "short")
    for t in longs:
        t.join()
    long_firsts = sorted(first[f"l{i}"] for i in range(N_LONG))
    if policy == "fair":
        assert first["short"] < long_firsts[0]
    else:  # the short prompt waits for the older prompts' prefill
        assert first["short"] > long_firsts[0]
