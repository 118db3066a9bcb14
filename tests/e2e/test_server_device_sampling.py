"""`pyqsa serve --sampling device`: tokens drawn inside the forward pass, over HTTP, equal those
a server that draws on the host, request by request (seeded sampling under the cuts,
greedy with logprobs, penalised and biased requests, whose adjustments go with the draw)."""

from __future__ import annotations

import json

import pytest
from conftest import THREADS, start_server, stop_server

REQUESTS = [
    {"temperature": 0.8, "seed": 3},
    {"temperature": 1.0, "top_p": 0.9, "seed": 5},
    {"temperature": 0, "logprobs": 2},
    {"temperature": 0.7, "seed": 9, "frequency_penalty": 0.5},
    {"temperature": 0, "presence_penalty": 1.5, "logit_bias": {"200": 4, "300": -100}},
    {"temperature": 0.9, "seed": 4, "extra_body": {"top_k": 20, "repetition_penalty": 1.4}},
]


@pytest.fixture(scope="module")
def device_server(demo_gguf, cache_dir):
    s = start_server(
        [
            str(demo_gguf),
            "--model-name",
            "pyqsa-demo",
            "--slots",
            "2",
            "--ctx",
            "512",
            "--sampling",
            "device",
            *THREADS,
        ],
        cache_dir,
    )
    yield s
    stop_server(s)


def test_the_start_line_says_where_tokens_are_drawn(device_server, server):
    assert any("pyqsa: sampling: device (tokens" in line for line in device_server.log)
    assert any("pyqsa: sampling: host (each" in line for line in server.log)


def test_by_default_tokens_are_drawn_on_the_device_of_a_gpu_build_and_else_on_the_host(
    small_server,
):
    from pyqsa.engine import paging

    where = "device" if paging.device_free(None) is not None else "host"
    assert any(f"pyqsa: sampling: {where} (auto: " in line for line in small_server.log)


def complete(server, kw):
    r = server.openai().completions.create(
        model=server.model, prompt="Once upon a time", max_tokens=16, **kw
    )
    lp = r.choices[0].logprobs
    return r.choices[0].text, lp.tokens if lp else None, lp.top_logprobs if lp else None


@pytest.mark.parametrize("kw", REQUESTS, ids=lambda kw: ",".join(map(str, kw.items())))
def test_device_sampling_equals_host_sampling(server, device_server, kw):
    text, tokens, top = complete(device_server, kw)
    want_text, want_tokens, want_top = complete(server, kw)
    assert text == want_text and tokens == want_tokens
    if top:
        for got, want in zip(top, want_top, strict=True):
            assert got.keys() == want.keys()
            assert all(abs(got[t] - want[t]) < 1e-4 for t in got)


def test_a_reply_under_a_grammar_is_drawn_on_the_host(server, device_server):
    """A JSON response_format's draws need the logits row (the grammar masks it on the host), so
    a device-sampling server makes them as the host-sampling one does."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    kw = dict(
        messages=[{"role": "user", "content": "JSON, please."}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        temperature=1.0,
        seed=7,
        max_tokens=48,
    )
    replies = [
        s.openai().chat.completions.create(model=s.model, **kw).choices[0]
        for s in (server, device_server)
    ]
    assert replies[0].message.content == replies[1].message.content
    assert all(r.finish_reason == "stop" for r in replies)
    assert isinstance(json.loads(replies[1].message.content)["ok"], bool)
