"""The HTTP app over an engine with a fake runner, served by uvicorn in this process: auth on
every /v1 route, status -> error type, internal errors, default output limit."""

from __future__ import annotations

import json
import logging
import threading

import httpx
import numpy as np
import pytest
from engine_fakes import N_VOCAB, FakeRunner, FakeVocab
from pyqsa.server.app import create_app
from pyqsa.server.chat_template import ChatTemplate
from pyqsa.server.cli import _uvicorn_server
from pyqsa.server.qwen_template import QWEN_TEMPLATE

from pyqsa.engine import Engine, EngineConfig

KEY = "unit-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BOOM = "boom"  # text the fake tokenizer fails on, as a bug would
BAD_PIECE = 50  # a token whose text the fake tokenizer fails to give
DEFAULT_MAX_TOKENS = 5
CONTROLS = {"<|im_start|>": 61, "<|im_end|>": 62}


class FakeTokenizer:
    """One token per UTF-8 byte (ids 1..60), plus two control tokens."""

    n_vocab = N_VOCAB

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        if BOOM in text:
            raise RuntimeError("tokenizer bug")
        return [b % 60 + 1 for b in text.encode("utf-8")]

    def token_bytes(self, token: int) -> bytes:
        if token == BAD_PIECE:
            raise RuntimeError("detokenizer bug")
        return f"<{token}>".encode()

    def control_tokens(self) -> dict[str, int]:
        return CONTROLS


class GatedRunner(FakeRunner):
    """A FakeRunner whose steps wait while `hold` is clear (to keep a slot busy)."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.stepping = threading.Event()
        super().__init__(hook=lambda chunks: (self.stepping.set(), self.hold.wait(30)))


@pytest.fixture(scope="module")
def app_server():
    runner = GatedRunner()
    config = EngineConfig("fake.gguf", n_slots=1, ctx_per_slot=64, max_waiting=0)
    engine = Engine(config, runner, FakeVocab()).start()
    app = create_app(
        engine,
        FakeTokenizer(),
        "fake",
        ChatTemplate(QWEN_TEMPLATE),
        api_key=KEY,
        max_body_bytes=4096,
        default_max_tokens=DEFAULT_MAX_TOKENS,
    )
    ready = threading.Event()
    urls: list[str] = []
    server = _uvicorn_server(app, "127.0.0.1", 0, lambda u: (urls.append(u), ready.set()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield app, urls[0], runner
    server.should_exit = True
    thread.join(10)
    engine.stop()


def chat(content: str = "hi", **kw) -> dict:
    return {"model": "fake", "messages": [{"role": "user", "content": content}], **kw}


def test_every_v1_route_needs_the_key(app_server):
    app, url, _ = app_server
    checked = set()
    for route in app.routes:
        if not route.path.startswith("/v1"):
            continue
        path = route.path.replace("{name:path}", "fake")
        for method in route.methods - {"HEAD"}:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                r = httpx.request(method, url + path, headers=headers, json=chat())
                assert r.status_code == 401, (method, path, headers)
                assert r.json()["error"]["type"] == "authentication_error"
            checked.add((method, path))
    assert checked == {
        ("GET", "/v1/models"),
        ("GET", "/v1/models/fake"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
    }


STATUS_CASES = [
    # (method, path, request kwargs, status, error type)
    ("POST", "/v1/chat/completions", {"content": b"{not json"}, 400, "invalid_request_error"),
    (
        "POST",
        "/v1/chat/completions",
        {"json": chat(temperature=1e-310)},
        400,
        "invalid_request_error",
    ),
    ("POST", "/v1/chat/completions", {"json": chat(), "headers": {}}, 401, "authentication_error"),
    ("GET", "/v1/nothing", {}, 404, "not_found_error"),
    ("GET", "/v1/models/other", {}, 404, "not_found_error"),
    ("GET", "/v1/chat/completions", {}, 405, "invalid_request_error"),
    ("PUT", "/v1/models", {}, 405, "invalid_request_error"),
    ("DELETE", "/v1/completions", {}, 405, "invalid_request_error"),
    ("POST", "/v1/chat/completions", {"json": chat("x" * 5000)}, 413, "request_too_large"),
    ("POST", "/v1/chat/completions", {"json": chat(BOOM)}, 500, "server_error"),
]


@pytest.mark.parametrize(
    "method, path, kw, status, type_", STATUS_CASES, ids=[str(c[3]) for c in STATUS_CASES]
)
def test_status_to_error_type(app_server, method, path, kw, status, type_):
    _, url, _ = app_server
    kw = {"headers": AUTH, **kw}
    r = httpx.request(method, url + path, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_ and err["message"]


def test_queue_full_is_429_with_retry_after(app_server):
    _, url, runner = app_server
    runner.hold.clear()
    runner.stepping.clear()
    with httpx.Client(headers=AUTH, timeout=30) as client:
        body = {"model": "fake", "prompt": [1], "max_tokens": 3}
        t = threading.Thread(
            target=client.post, args=(url + "/v1/completions",), kwargs={"json": body}
        )
        t.start()
        try:
            assert runner.stepping.wait(10)  # the one slot is busy, nothing may wait
            r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            assert int(r.headers["retry-after"]) >= 1
        finally:
            runner.hold.set()
            t.join(30)


def test_internal_error_is_logged_once_and_closes_the_connection(app_server, caplog):
    _, url, _ = app_server
    secret = "secret-words-of-the-client"
    with httpx.Client(headers=AUTH, timeout=30) as client:
        r = client.post(url + "/v1/chat/completions", json=chat(f"{BOOM} {secret}"))
        assert r.status_code == 500
        assert r.json()["error"] == {
            "message": "internal error: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        assert r.headers["connection"] == "close"
        # the client opens a new connection and goes on
        ok = client.post(url + "/v1/chat/completions", json=chat(max_tokens=2))
        assert ok.status_code == 200
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info
    assert secret not in caplog.text


def test_internal_error_mid_stream_ends_it_with_an_error_event(app_server, caplog):
    _, url, _ = app_server
    # FakeRunner's next token is the last one + 1; its logprob needs BAD_PIECE's text
    body = {"model": "fake", "prompt": [BAD_PIECE - 1], "logprobs": 1, "stream": True}
    with httpx.Client(headers=AUTH, timeout=30) as client:
        with client.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert '"server_error"' in data[-1] and "[DONE]" not in data
        assert client.post(url + "/v1/chat/completions", json=chat(max_tokens=1)).status_code == 200
    assert len([rec for rec in caplog.records if rec.levelno >= logging.ERROR]) == 1


def test_requests_without_max_tokens_get_the_default_cap(app_server):
    _, url, _ = app_server
    with httpx.Client(headers=AUTH, timeout=30) as client:
        r = client.post(url + "/v1/chat/completions", json=chat(ignore_eos=True))
        assert r.json()["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS
        body = {"model": "fake", "prompt": "a", "max_tokens": None, "ignore_eos": True}
        r = client.post(url + "/v1/completions", json=body)
        assert r.json()["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS


def test_a_token_id_prompt_is_not_walked_for_surrogates(monkeypatch):
    """Only the strings and containers of a list are looked into: a 200K-token prompt cost the
    event loop ~70 ms in a call (and a path) per id. A token-id prompt is not looked into at
    all: its one pass over the types found no strings."""
    from pyqsa.server import protocol

    calls = []
    walk = protocol._lone_surrogate_at

    def counted(value, path):
        calls.append(path)
        return walk(value, path)

    monkeypatch.setattr(protocol, "_lone_surrogate_at", counted)
    body = protocol.CompletionRequest.model_validate({"model": "m", "prompt": list(range(1000))})
    assert len(body.prompt) == 1000 and calls.count("prompt") == 0 and len(calls) < 20
    assert counted([1, 2, ["a", "\ud800"]], "p") == "p.2.1"


@pytest.mark.parametrize("ids", [[-1], [N_VOCAB], [2**63], [-(2**64)], [10**30, 1]], ids=str)
def test_token_ids_outside_the_vocabulary_are_refused(app_server, ids):
    _, url, _ = app_server
    body = {"model": "fake", "prompt": ids, "max_tokens": 1}
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "prompt: token id out of range",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": None,
    }


def test_token_ids_reach_the_engine_as_sent():
    from pyqsa.server.protocol import token_ids

    ids = token_ids([0, 5, N_VOCAB - 1], N_VOCAB)
    assert ids.dtype == np.int64 and ids.tolist() == [0, 5, N_VOCAB - 1]
    assert token_ids([], N_VOCAB).size == 0  # the engine refuses it, as any empty prompt


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": [1, 2.5, -0.0, 1e999, NaN, -Infinity, 123456789012345678901234567890]}',
        b'{"a": "\\ud83d\\ude42 \\u0000 \\/", "a": null}',
        b'{"a": "x\\ud800"}',  # a lone surrogate: jiter refuses, json takes
        b'{"a": "x\xed\xa0\x80"}',
        b"\xef\xbb\xbf{}",
        '{"a": 1}'.encode("utf-16"),
        b"[" * 300 + b"]" * 300,
    ],
)
def test_bodies_parse_as_json_parses_them(body):
    from pyqsa.server.json_body import loads

    assert repr(loads(body)) == repr(json.loads(body))


@pytest.mark.parametrize("body", [b"", b"{", b"[1,]", b'"a\x01"', b"01", b"\xff"])
def test_bodies_json_refuses_are_refused_as_json_refuses_them(body):
    from pyqsa.server.json_body import loads

    with pytest.raises(ValueError) as want:
        json.loads(body)
    with pytest.raises(type(want.value)):
        loads(body)
