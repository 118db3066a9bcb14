"""response_format json_object / json_schema: the reply is drawn under a grammar of JSON (any
object, or the schema's), so it parses, and it ends when the JSON is complete."""

from __future__ import annotations

import json

import pytest

USER = [{"role": "user", "content": "Answer in JSON."}]
OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": OK_SCHEMA}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_json_schema_reply_parses_and_follows_the_schema(server, seed):
    r = server.openai().chat.completions.create(
        model=server.model,
        messages=USER,
        response_format=AS_SCHEMA,
        temperature=1.0,
        seed=seed,
        max_tokens=64,
    )
    (choice,) = r.choices
    assert choice.finish_reason == "stop", choice.message.content
    reply = json.loads(choice.message.content)
    assert set(reply) == {"ok", "n"} and isinstance(reply["ok"], bool) and reply["n"] in (1, 2, 3)


def test_streamed_the_same_reply(server):
    kw = dict(model=server.model, messages=USER, response_format=AS_SCHEMA, seed=4, max_tokens=64)
    whole = server.openai().chat.completions.create(**kw).choices[0].message.content
    chunks = list(server.openai().chat.completions.create(stream=True, **kw))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole and chunks[-1].choices[0].finish_reason == "stop"
    json.loads(streamed)


def test_json_object_ends_the_reply_when_the_object_closes(server, tokenizer):
    """Steered to write "{}" (logit bias, each token's bias spent once written): under the
    grammar the reply ends there (only whitespace or an end token may follow), without it the
    model goes on to max_tokens."""
    wanted = tokenizer.tokenize("{}", special=False)
    steer = {
        "temperature": 0,
        "max_tokens": 40,
        "logit_bias": {str(t): 100 - 3 * i for i, t in enumerate(wanted)},
        "extra_body": {"repetition_penalty": 3.0},
    }
    client = server.openai()
    fmt = {"type": "json_object"}
    r = client.chat.completions.create(
        model=server.model, messages=USER, response_format=fmt, **steer
    )
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content) == {}
    free = client.chat.completions.create(model=server.model, messages=USER, **steer)
    assert free.choices[0].finish_reason == "length"
    assert free.choices[0].message.content.startswith("{}")
