"""Bad input gets an OpenAI-shaped 4xx with a stable error type, never a 500."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from conftest import API_KEY, DEFAULT_MAX_TOKENS, wait_idle

CHAT = {"model": "pyqsa-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def post(server, body=None, *, content=None, headers=None, path="/chat/completions"):
    h = {**server.headers(), **(headers or {})}
    if content is not None:
        h.setdefault("Content-Type", "application/json")
        return httpx.post(server.v1 + path, content=content, headers=h, timeout=30)
    return httpx.post(server.v1 + path, json=body, headers=h, timeout=30)


def check(r: httpx.Response, status: int, type_: str, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_ and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"", b"[]", b'"text"', b"\xff\xfe"],
    ids=["malformed", "empty", "array", "string", "binary"],
)
def test_malformed_bodies(server, content):
    check(post(server, content=content), 400, "invalid_request_error")


@pytest.mark.parametrize(
    "patch, param",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content",
        ),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "messages.0.content"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
        ({"logit_bias": {"--5": 1}}, "logit_bias"),
        ({"logit_bias": {"-5": 1}}, "logit_bias"),
        ({"logit_bias": {"+5": 1}}, "logit_bias"),
        ({"logit_bias": {" 5": 1}}, "logit_bias"),
        ({"logit_bias": {"5_0": 1}}, "logit_bias"),
        ({"logit_bias": {"²": 1}}, "logit_bias"),  # superscript two: isdigit(), not int()
        ({"logit_bias": {"٣": 1}}, "logit_bias"),  # Arabic three: int() takes it as 3
        ({"logit_bias": {"9" * 5000: 1}}, "logit_bias"),  # more digits than int() reads
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"temperature": 1e-310}, "temperature"),  # subnormal: sampling would give NaN
        ({"temperature": 1e-4}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"repetition_penalty": 1e-310}, "repetition_penalty"),
        ({"repetition_penalty": 1000}, "repetition_penalty"),
        ({"top_p": 0}, "top_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -1}, "top_k"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"temperature": 1e-310, "stream": True}, "temperature"),  # refused before streaming
        ({"model": 5}, "model"),
        ({"tool_choice": "required"}, "tool_choice"),  # and no tools
        ({"response_format": {"type": "json_schema"}}, "response_format"),  # no json_schema
        (  # a schema llama.cpp's converter cannot turn into a grammar
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {}}},
                }
            },
            "response_format",
        ),
        (  # a forced call is no JSON object
            {
                "response_format": {"type": "json_object"},
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "required",
            },
            "response_format",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"tool_choice": {"type": "function"}}, "tool_choice"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": []},
            "tool_choice",
        ),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "other"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice",
        ),
    ],
)
def test_wrong_types_and_values(server, patch, param):
    check(post(server, {**CHAT, **patch}), 400, "invalid_request_error", param)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty"])
def test_non_finite_numbers(server, field, literal):
    body = f'{{"model": "pyqsa-demo", "prompt": "a", "{field}": '.encode() + literal + b"}"
    check(post(server, content=body, path="/completions"), 400, "invalid_request_error", field)


SURROGATE_ESCAPE = b'"a\\ud800b"'  # JSON text "a\ud800b"
SURROGATE_BYTES = b'"a\xed\xa0\x80b"'  # UTF-8-style bytes of U+D800, which json accepts


@pytest.mark.parametrize("text", [SURROGATE_ESCAPE, SURROGATE_BYTES], ids=["escape", "bytes"])
@pytest.mark.parametrize(
    "template, path, param",
    [
        (b'{"model": "pyqsa-demo", "prompt": %s}', "/completions", "prompt"),
        (b'{"model": "pyqsa-demo", "prompt": ["x", %s]}', "/completions", "prompt"),
        (b'{"model": "pyqsa-demo", "prompt": "x", "stop": [%s]}', "/completions", "stop"),
        (b'{"model": %s, "prompt": "x"}', "/completions", "model"),
        (b'{"model": "pyqsa-demo", "messages": [{"role": "user", "content": %s}]}', "", "messages"),
        (
            b'{"model": "pyqsa-demo", "messages": [{"role": "user", "content": '
            b'[{"type": "text", "text": %s}]}]}',
            "",
            "messages",
        ),
        (
            b'{"model": "pyqsa-demo", "messages": [{"role": "user", "content": "x", "name": %s}]}',
            "",
            "messages",
        ),
        (
            b'{"model": "pyqsa-demo", "messages": [{"role": "user", "content": "x"}], '
            b'"tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"properties": {%s: {"type": "string"}}}}}]}',
            "",
            "tools",
        ),
        (
            b'{"model": "pyqsa-demo", "messages": [{"role": "user", "content": "x"}], '
            b'"logit_bias": {%s: 1}}',
            "",
            "logit_bias",
        ),
    ],
    ids=["prompt", "prompt-list", "stop", "model", "content", "part", "name", "tool-key", "bias"],
)
def test_lone_surrogates_are_refused(server, template, path, param, text):
    """JSON can spell a lone UTF-16 surrogate, which UTF-8 (and so the tokenizer) cannot."""
    r = post(server, content=template % text, path=path or "/chat/completions")
    check(r, 400, "invalid_request_error", param)
    assert "surrogate" in r.json()["error"]["message"]


def test_a_paired_surrogate_escape_is_fine(server):
    body = b'{"model": "pyqsa-demo", "prompt": "a\\ud83d\\ude42b", "max_tokens": 1}'
    assert post(server, content=body, path="/completions").status_code == 200


def test_missing_fields(server):
    check(post(server, {"messages": CHAT["messages"]}), 400, "invalid_request_error", "model")
    check(post(server, {"model": "pyqsa-demo"}), 400, "invalid_request_error", "messages")
    check(
        post(server, {"model": "pyqsa-demo"}, path="/completions"),
        400,
        "invalid_request_error",
        "prompt",
    )


def test_empty_prompt(server):
    body = {"model": "pyqsa-demo", "prompt": "", "max_tokens": 1}
    check(post(server, body, path="/completions"), 400, "invalid_request_error", "prompt")


@pytest.mark.parametrize(
    "patch,param",
    [
        ({"prompt": [[1, 2], [3]]}, "prompt"),  # a batch of prompts
        ({"prompt": [1, "x"]}, "prompt"),
        ({"prompt": True}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
    ],
)
def test_completions_take_one_prompt(server, patch, param):
    body = {"model": "pyqsa-demo", "max_tokens": 1, **patch}
    err = check(post(server, body, path="/completions"), 400, "invalid_request_error", param)
    if param == "prompt":
        assert "one prompt per request" in err["message"]


def test_unknown_model_and_route(server):
    err = check(post(server, {**CHAT, "model": "gpt-9"}), 404, "not_found_error", "model")
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        server.openai().completions.create(model="gpt-9", prompt="x", max_tokens=1)
    r = httpx.get(server.v1 + "/nothing-here", headers=server.headers())
    check(r, 404, "not_found_error")
    r = httpx.get(server.v1 + "/chat/completions", headers=server.headers())
    check(r, 405, "invalid_request_error")


def test_context_overflow(server, tokenizer):
    long = "hello " * 600  # the server's slots hold 512 tokens
    assert len(tokenizer.tokenize(long)) > 512
    err = check(
        post(server, {**CHAT, "messages": [{"role": "user", "content": long}]}),
        400,
        "invalid_request_error",
    )
    assert err["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        server.openai().completions.create(model=server.model, prompt=long, max_tokens=1)
    ids = [1] * 512
    r = post(server, {"model": "pyqsa-demo", "prompt": ids, "max_tokens": 1}, path="/completions")
    check(r, 400, "invalid_request_error")


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/chat/completions"),
        ("POST", "/completions"),
        ("GET", "/models"),
        ("GET", "/models/pyqsa-demo"),
    ],
)
def test_api_key_required(server, method, path):
    """tests/unit/test_server_app.py checks every /v1 route of the app; this, the real server."""
    body = {**CHAT, "prompt": "x"}
    r = httpx.request(method, server.v1 + path, json=body)
    check(r, 401, "authentication_error")
    r = httpx.request(method, server.v1 + path, json=body, headers={"Authorization": "Bearer no"})
    assert check(r, 401, "authentication_error")["code"] == "invalid_api_key"


def test_api_key_from_a_file_is_not_in_the_command_line(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.v1, api_key="wrong").models.list()
    assert server.openai().models.list().data
    assert API_KEY not in " ".join(server.proc.args)
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no key


# fields OpenAI's schema lets be null, on both endpoints and on one (pyqsa's extensions too)
NULLABLE = ["top_p", "n", "stream", "presence_penalty", "frequency_penalty", "logprobs", "top_k"]
NULLABLE += ["min_p", "repetition_penalty", "ignore_eos"]
NULLABLE_COMPLETIONS = ["echo", "parse_special"]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_explicit_nulls_take_the_defaults(server, path):
    """Clients built on OpenAI's schema send explicit nulls: each takes the field's default,
    the same tokens as a request without them."""
    chat = path == "/chat/completions"
    base = CHAT if chat else {"model": "pyqsa-demo", "prompt": "hi", "max_tokens": 2}
    base = {**base, "seed": 7, "temperature": 0.8}
    nulls = dict.fromkeys(NULLABLE + ([] if chat else NULLABLE_COMPLETIONS))
    plain, nulled = post(server, base, path=path), post(server, {**base, **nulls}, path=path)
    assert plain.status_code == nulled.status_code == 200, nulled.text
    key = "message" if chat else "text"
    assert nulled.json()["choices"][0][key] == plain.json()["choices"][0][key]
    assert post(server, {**base, "temperature": None}, path=path).status_code == 200


def test_tool_choice_may_name_a_given_tool(server):
    tools = [{"type": "function", "function": {"name": "f"}}]
    for choice in ["required", {"type": "function", "function": {"name": "f"}}]:
        r = post(server, {**CHAT, "tools": tools, "tool_choice": choice})
        assert r.status_code == 200, r.text


def test_response_format_text_is_the_default(server):
    r = post(server, {**CHAT, "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


def test_chat_without_max_tokens_gets_the_default_cap(server):
    body = {"model": "pyqsa-demo", "messages": CHAT["messages"], "ignore_eos": True}
    r = post(server, body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS


def test_oversized_body(server):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    check(post(server, big), 413, "request_too_large")

    def chunked():  # no Content-Length: counted as it arrives
        yield b'{"model": "pyqsa-demo", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}]}'

    check(post(server, content=chunked()), 413, "request_too_large")


def test_queue_full_is_429(small_server):
    """One slot, no waiting room: a second request while the first runs is refused."""
    s = small_server
    started = threading.Event()
    done = threading.Event()

    def long_request():
        body = {"model": s.model, "prompt": "a", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", s.v1 + "/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()
                if done.is_set():
                    break

    t = threading.Thread(target=long_request)
    t.start()
    try:
        assert started.wait(30)
        r = httpx.post(s.v1 + "/completions", json={"model": s.model, "prompt": "b"})
        err = check(r, 429, "rate_limit_error")
        assert err["code"] == "queue_full"
        assert int(r.headers["retry-after"]) >= 1
    finally:
        done.set()
        t.join(60)
    assert wait_idle(s)["pyqsa_busy_slots"] == 0  # hanging up freed the slot
