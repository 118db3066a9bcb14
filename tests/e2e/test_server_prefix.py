"""The prefix cache through `pyqsa serve` on the demo model, paging on: what a client sees.
usage.prompt_tokens_details.cached_tokens (completions and chat, streamed usage too), the
/metrics counters, a follow-up's answer equal to a server without the cache, a cancelled
reused request leaving the cache as it was. Exactness in every case, paged and unpaged, and
sharing are checked on the engine (tests/unit/test_prefix_exact.py)."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from conftest import THREADS, start_server, stop_server

COMMON = ["--slots", "4", "--ctx", "512", "--sampling", "host", *THREADS]
PROMPT = [int(t) for t in np.random.default_rng(28).integers(200, 20000, 150)]
GREEDY = {"temperature": 0, "max_tokens": 8, "logprobs": 3, "ignore_eos": True}


def new_tokens(n: int, salt: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(salt).integers(200, 20000, n)]


@pytest.fixture(scope="module")
def cold(demo_gguf, cache_dir):
    s = start_server([str(demo_gguf), *COMMON, "--prefix-cache-gib", "0"], cache_dir)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def warm(demo_gguf, cache_dir):
    s = start_server(
        [str(demo_gguf), *COMMON, "--prefix-cache-gib", "0.25", "--kv-offload", "host"],
        cache_dir,
    )
    yield s
    stop_server(s)


def idle(server, timeout: float = 30) -> dict[str, float]:
    """Metrics once no slot is busy and nothing waits (the engine's own requests included: a
    finished reply computed again as a prompt)."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["pyqsa_busy_slots"] == m["pyqsa_queue_length"] == m["pyqsa_requests_in_flight"] == 0:
            return m
        assert time.monotonic() < deadline, "the server did not go idle"
        time.sleep(0.05)


def complete(server, prompt, **params) -> dict:
    body = {"model": server.model, "prompt": prompt, **GREEDY, **params}
    r = httpx.post(server.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_start_line_says_the_budget(warm, cold):
    assert any("prefix cache: up to 256.0 MiB" in line for line in warm.log)
    assert any("prefix cache: off" in line for line in cold.log)


def test_a_follow_up_reuses_the_prompt_and_answers_as_without_the_cache(warm, cold):
    before = idle(warm)
    first = complete(warm, PROMPT)
    assert cached(first) == 0
    assert cached(complete(cold, PROMPT)) == 0
    idle(warm)
    prompt = PROMPT + new_tokens(24, 1)
    got = complete(warm, prompt)
    assert cached(got) == len(PROMPT)
    want = complete(cold, prompt)
    assert cached(want) == 0
    assert got["choices"] == want["choices"]  # text and logprobs
    m = idle(warm)
    hits = m["pyqsa_prefix_cache_hit_tokens_total"] - before["pyqsa_prefix_cache_hit_tokens_total"]
    misses = (
        m["pyqsa_prefix_cache_miss_tokens_total"] - before["pyqsa_prefix_cache_miss_tokens_total"]
    )
    assert (hits, misses) == (len(PROMPT), len(PROMPT) + 24)
    resumed = 'pyqsa_prefix_cache_starts_total{how="resume"}'
    assert m[resumed] - before[resumed] == 1  # in the slot that held the prompt and its reply
    assert not any("prefix" in name for name in m if name.startswith("pyqsa_ledger_bytes"))
    assert m["pyqsa_prefix_cache_bytes"] > 0 and m["pyqsa_prefix_cache_entries"] >= 2
    assert m["pyqsa_prefix_cache_evicted_total"] == 0


def test_streamed_usage_has_cached_tokens(warm):
    complete(warm, PROMPT)
    idle(warm)
    body = {
        "model": warm.model,
        "prompt": PROMPT + new_tokens(10, 2),
        **GREEDY,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", warm.v1 + "/completions", json=body, timeout=60) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert cached(events[-1]) == len(PROMPT)
    idle(warm)


def test_chat_second_turn_reuses_the_first(warm):
    client = warm.openai()
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What is a prefix cache?"},
    ]
    first = client.chat.completions.create(
        model=warm.model, messages=messages, max_tokens=8, temperature=0
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    idle(warm)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And why?"},
    ]
    chunks = list(
        client.chat.completions.create(
            model=warm.model,
            messages=messages,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    # the template appends turns: the first turn's prompt starts the second's (its reply too
    # when the reply's text tokenizes back to the tokens drawn, which random weights rarely do)
    assert first.usage.prompt_tokens <= usage.prompt_tokens_details.cached_tokens
    assert usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens
    idle(warm)


def test_cancel_during_a_reused_request_leaves_the_cache_intact(warm, cold):
    complete(warm, PROMPT)
    before = idle(warm)
    prompt = PROMPT + new_tokens(8, 3)
    body = {**GREEDY, "model": warm.model, "prompt": prompt, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", warm.v1 + "/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # its first token came, from the cached prefix: hang up
    after = idle(warm)
    cancelled = 'pyqsa_requests_finished_total{reason="cancelled"}'
    assert after[cancelled] == before[cancelled] + 1
    # the prompt's end was kept; a cancelled request's reply is not computed again
    assert after["pyqsa_prefix_cache_entries"] == before["pyqsa_prefix_cache_entries"] + 1
    assert after["pyqsa_prefix_cache_evicted_total"] == before["pyqsa_prefix_cache_evicted_total"]
    heads = "pyqsa_prefix_cache_snapshots_total"
    assert after[heads] == before[heads] + 1  # that entry's head, taken on the engine thread
    staged = "pyqsa_prefix_cache_snapshots_staged_total"  # its state copied off the thread
    assert after[staged] == before[staged] + 1
    got = complete(warm, prompt + new_tokens(4, 4))
    assert cached(got) == len(prompt)
    assert got["choices"] == complete(cold, prompt + new_tokens(4, 4))["choices"]
    idle(warm)
