"""Property-based fuzzing of both completion endpoints on the demo model (hypothesis).

Whatever a client sends (field values of any JSON type, near-valid numbers, lone surrogates,
control-token text, raw bytes), the answer is a 2xx or a 4xx with an OpenAI-shaped body, never
a 5xx or a hang; a 200 stream ends with [DONE] and no error event; afterwards every gauge is
back at 0. The run is derandomized (the same examples each run) and bounded by FUZZ_EXAMPLES
(about two minutes on the CI machine); PYQSA_FUZZ_EXAMPLES overrides it.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import httpx
import pytest
from conftest import API_KEY, THREADS, start_server, stop_server, wait_idle
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

FUZZ_EXAMPLES = int(os.environ.get("PYQSA_FUZZ_EXAMPLES", "600"))
TIMEOUT_S = 60  # a request not answered by then is a hang

# -- values ----------------------------------------------------------------------------------

TRICKY_TEXT = [
    "\ud800",  # lone surrogates: not encodable as UTF-8
    "\udfff",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "\x00",
    "\n",
    "é",
    "🙂",
    "٣",
    "²",
]
text = st.one_of(
    st.text(max_size=12),
    st.lists(st.sampled_from(TRICKY_TEXT) | st.text(max_size=3), max_size=4).map("".join),
)
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(),  # NaN and infinities included: Python's json reads them
    text,
)
junk = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)


def near(lo: float, hi: float, *edges: float) -> st.SearchStrategy:
    """A value in [lo, hi], or one of `edges`: at and past the limits."""
    return st.floats(lo, hi) | st.sampled_from(edges)


# Each field's plausible values (its own type, often at or past a limit); a "wild" request
# also draws any field from `junk`.
token_ids = st.lists(st.integers(-2, 200_000), min_size=0, max_size=6)
small_ints = st.sampled_from([1, 2, 3, 5, 8, 12, None, None, 0, -1])
SAMPLING = {
    "max_tokens": small_ints,
    "temperature": near(1e-3, 2, 0, 0, 1e-3, 2, 1e-310, 1e-4, 2.01, -1),
    "top_p": near(1e-3, 1, 1, 1e-310, 0, 1.01),
    "top_k": st.integers(-1, 200_000) | st.sampled_from([2**31 - 1, 2**31, 2**63]),
    "min_p": near(0, 1, 0, 1e-310, 1, 1.01),
    "repetition_penalty": near(0.01, 100, 0.01, 100, 1e-310, 0, 101),
    "presence_penalty": near(-2, 2, -2, 2, 2.5),
    "frequency_penalty": near(-2, 2, -2, 2, -2.5),
    "seed": st.integers(),
    "stop": text | st.lists(text, max_size=5),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "logit_bias": st.dictionaries(
        st.sampled_from(["0", "5", "--5", "-5", "²", "٣", "151643", "99999999"]) | text,
        near(-100, 100, -100, 100, 101),
        max_size=3,
    ),
    "ignore_eos": st.booleans(),
    "stop_token_ids": token_ids,
    "n": st.sampled_from([1, 1, 1, 2]),
    "user": text,
}
content = text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}))
tool_call = st.fixed_dictionaries(
    {
        "id": text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": text, "arguments": text}),
    }
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "user", "assistant", "tool", "x"])},
    optional={
        "content": content,
        "name": text,
        "tool_calls": st.lists(tool_call, max_size=2),
        "tool_call_id": text,
    },
)
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": text}, optional={"description": text, "parameters": junk}
        ),
    }
)
CHAT_REQUIRED = {
    "model": st.sampled_from(["pyqsa-demo"] * 6 + ["gpt-4o", ""]),
    "messages": st.lists(message, min_size=1, max_size=3) | st.just([]),
    "stream": st.booleans(),  # optional, but half of the requests should stream
}
CHAT = {
    **SAMPLING,
    "max_completion_tokens": small_ints,
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(-1, 21),
    "tools": st.lists(tool, max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required"]),
}
# NOTE: completions' max_tokens is always sent: its default (16) would make valid requests
# the bulk of the run time
COMPLETIONS_REQUIRED = {
    "model": CHAT_REQUIRED["model"],
    "prompt": text | token_ids | st.lists(text, max_size=2),
    "max_tokens": small_ints,
    "stream": CHAT_REQUIRED["stream"],
}
COMPLETIONS = {
    **{k: v for k, v in SAMPLING.items() if k != "max_tokens"},
    "logprobs": st.integers(-1, 6) | st.none(),
    "echo": st.booleans(),
    "suffix": text | st.none(),
    "parse_special": st.booleans(),
}


def body(required: dict, optional: dict) -> st.SearchStrategy[dict]:
    """A request: the endpoint's required fields, up to 5 of its optional ones, unknown
    extras; in a wild one any field may be junk."""

    def build(wild: bool) -> st.SearchStrategy[dict]:
        def fields(strategies: dict) -> st.SearchStrategy[dict]:
            return st.fixed_dictionaries(
                {k: v | junk if wild else v for k, v in strategies.items()}
            )

        chosen = st.lists(st.sampled_from(sorted(optional)), max_size=5, unique=True)
        parts = st.tuples(
            st.dictionaries(text, junk, max_size=2),
            chosen.flatmap(lambda names: fields({k: optional[k] for k in names})),
            fields(required),
        )
        return parts.map(lambda p: {**p[0], **p[1], **p[2]})

    return st.booleans().flatmap(build)


requests = st.one_of(
    st.tuples(st.just("/chat/completions"), body(CHAT_REQUIRED, CHAT)),
    st.tuples(st.just("/completions"), body(COMPLETIONS_REQUIRED, COMPLETIONS)),
)


def encode(obj: dict, ascii_only: bool) -> bytes:
    """JSON bytes; a lone surrogate becomes a \\ud800 escape, or (not ascii_only) the bytes
    ED A0 80, which Python's json decodes to the same string."""
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# -- the property ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(demo_gguf, cache_dir):
    """4 slots of 256 tokens, one compute thread, an API key, and requests without max_tokens
    capped at 4 tokens: valid requests stay short."""
    s = start_server(
        [
            str(demo_gguf),
            "--model-name",
            "pyqsa-demo",
            "--slots",
            "4",
            "--ctx",
            "256",
            "--api-key",
            API_KEY,
            "--default-max-tokens",
            "4",
            *THREADS,
        ],
        cache_dir,
    )
    s.api_key = API_KEY
    yield s
    stop_server(s)


def check_reply(r: httpx.Response, streamed: bool) -> str:
    """Fail on a 5xx, a malformed error or an unfinished stream; return a short outcome."""
    if r.status_code >= 400 or not streamed:
        r.read()
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
        field = (err["param"] or "").split(".")[0]
        return f"{r.status_code} {err['type']} {field}".rstrip()
    if streamed:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert data and data[-1] == "[DONE]", data[-3:]
        assert not any(d.startswith('{"error"') for d in data), data[-3:]
        return "200 stream"
    assert r.json()["choices"], r.text[:500]
    return "200"


def test_fuzz_both_endpoints(fuzz_server):
    outcomes: Counter[str] = Counter()
    examples = Counter()
    t0 = time.monotonic()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        request=requests,
        raw=st.tuples(st.sampled_from([False] * 9 + [True]), st.binary(max_size=40)),
        ascii_only=st.booleans(),
        auth=st.sampled_from(["ok"] * 8 + ["none", "wrong"]),
    )
    def one(request, raw, ascii_only, auth):
        path, obj = request
        raw = raw[1] if raw[0] else None  # one request in ten: bytes, not JSON
        headers = {"Content-Type": "application/json"}
        if auth != "none":
            key = fuzz_server.api_key if auth == "ok" else "wrong"
            headers["Authorization"] = f"Bearer {key}"
        content = raw if raw is not None else encode(obj, ascii_only)
        streamed = raw is None and obj.get("stream") is True
        examples[(path, "raw" if raw is not None else "json", "stream" if streamed else "")] += 1
        with httpx.stream(
            "POST", fuzz_server.v1 + path, content=content, headers=headers, timeout=TIMEOUT_S
        ) as r:
            outcomes[check_reply(r, streamed)] += 1

    one()
    elapsed = time.monotonic() - t0
    print(f"\nfuzz: {sum(examples.values())} requests in {elapsed:.0f} s")
    for k, n in sorted(examples.items()):
        print(f"  sent {n:4d} {' '.join(x for x in k if x)}")
    for k, n in sorted(outcomes.items()):
        print(f"  got  {n:4d} {k}")
    m = wait_idle(fuzz_server)
    for gauge in (
        "pyqsa_busy_slots",
        "pyqsa_queue_length",
        "pyqsa_requests_in_flight",
        "pyqsa_http_open_requests",
    ):
        assert m[gauge] == 0, (gauge, m[gauge])
    assert outcomes["200"] + outcomes["200 stream"] > 0, "nothing was valid: fuzzing too blunt"
