"""Tool calls: the model's `<tool_call>{json}</tool_call>` comes back as OpenAI tool_calls.

How the random demo model is steered into writing a tool call: every token of the wanted
reply gets a logit bias, the first +100 and each next one 3 less, and repetition_penalty=3
divides a biased logit by 3 once its token has been seen. So at every step the first token
not yet written has the highest logit (the model's own logits are within about +-1), and the
reply is the wanted tokens in order. That needs distinct tokens which do not occur in the
prompt; the test-only template (tool_template.jinja) keeps the tool definitions out of the
prompt, and the test checks both conditions before relying on them.
"""

from __future__ import annotations

import json

import pytest
from conftest import HERE
from pyqsa.server.chat_template import ChatTemplate, forced_call_start

CALL = '<tool_call>{"name":"get_weather","arguments":{"city": "Paris"}}</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
USER = [{"role": "user", "content": "Weather?"}]


def rendered_prompt(tokenizer) -> list[int]:
    template = ChatTemplate((HERE / "tool_template.jinja").read_text())
    return tokenizer.tokenize(template.render(USER, TOOLS))


def steering(tokenizer, reply: str, prompt: list[int]) -> dict:
    """Request fields that make the model write `reply` after `prompt`."""
    wanted = tokenizer.tokenize(reply)
    assert len(set(wanted)) == len(wanted), "the steering needs distinct tokens"
    assert not set(wanted) & set(prompt), "the steering needs tokens absent from the prompt"
    return {
        "max_tokens": len(wanted),
        "temperature": 0,
        "logit_bias": {str(t): 100 - 3 * i for i, t in enumerate(wanted)},
        "extra_body": {"repetition_penalty": 3.0},
    }


@pytest.fixture(scope="module")
def steer(tokenizer):
    return steering(tokenizer, CALL, rendered_prompt(tokenizer))


def test_tool_call_round_trip(small_server, steer, tokenizer):
    client = small_server.openai()
    r = client.chat.completions.create(
        model=small_server.model, messages=USER, tools=TOOLS, **steer
    )
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    # second turn: the call and its result go back through the template
    messages = USER + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    r2 = client.chat.completions.create(
        model=small_server.model, messages=messages, tools=TOOLS, max_tokens=3, temperature=0
    )
    assert r2.choices[0].finish_reason == "length" and r2.choices[0].message.tool_calls is None
    expected_prompt = (
        "<|im_start|>user\nWeather?<|im_end|>\n"
        '<|im_start|>assistant\n[call get_weather {"city": "Paris"}]<|im_end|>\n'
        "<|im_start|>tool\nsunny, 21 C<|im_end|>\n"
        "<|im_start|>system\n1 tools<|im_end|>\n<|im_start|>assistant\n"
    )
    assert r2.usage.prompt_tokens == len(tokenizer.tokenize(expected_prompt))


def test_tool_call_streamed_as_deltas(small_server, steer):
    client = small_server.openai()
    chunks = list(
        client.chat.completions.create(
            model=small_server.model, messages=USER, tools=TOOLS, stream=True, **steer
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content and "get_weather" not in content
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.index for tc in calls] == [0]
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_the_text_stays_content(small_server, steer):
    r = small_server.openai().chat.completions.create(
        model=small_server.model, messages=USER, **steer
    )
    assert r.choices[0].message.content == CALL
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "length"


def forced_prompt(tokenizer, name: str | None) -> list[int]:
    """The prompt of a forced call: the conversation, then the reply's forced start."""
    start = tokenizer.tokenize("<tool_call>" + forced_call_start(name), special=False)
    return rendered_prompt(tokenizer) + start


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_starts_the_reply_inside_the_call(small_server, tokenizer, stream):
    """A named tool_choice: the call's opening up to its arguments is part of the prompt, so the
    model writes only the arguments and the call's end; the call comes back whole."""
    tool_choice = {"type": "function", "function": {"name": "get_weather"}}
    prompt = forced_prompt(tokenizer, "get_weather")
    body = steering(tokenizer, " {}}</tool_call>", prompt)
    client = small_server.openai()
    args = dict(model=small_server.model, messages=USER, tools=TOOLS, tool_choice=tool_choice)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **args, **body))
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.chat.completions.create(**args, **body)
        calls, content = r.choices[0].message.tool_calls, r.choices[0].message.content
        finish = r.choices[0].finish_reason
        assert r.usage.prompt_tokens == len(prompt)
    assert finish == "tool_calls" and not content
    (call,) = calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {}


# parameters whose every valid value is short, so a reply under the grammar always closes
FIXED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_unit",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["c", "f"]}},
                "required": ["unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "reset",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "set_unit"}}]
)
def test_a_forced_call_follows_its_functions_schema(small_server, tool_choice, seed):
    """Under a forced tool_choice the rest of the call is drawn under a grammar of the tools'
    names and parameters: whatever the (random) model prefers, the reply is one valid call."""
    r = small_server.openai().chat.completions.create(
        model=small_server.model,
        messages=USER,
        tools=FIXED_TOOLS,
        tool_choice=tool_choice,
        temperature=1.0,
        seed=seed,
        max_tokens=48,
    )
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    if isinstance(tool_choice, dict) or call.function.name == "set_unit":
        assert call.function.name == "set_unit" and arguments in ({"unit": "c"}, {"unit": "f"})
    else:
        assert call.function.name == "reset" and arguments == {}


def test_a_forced_call_cut_short_comes_back_as_text(small_server, tokenizer):
    """A forced call the model has not closed when max_tokens ends it is the reply's text, its
    forced start included, as any unfinished call is."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = steering(tokenizer, " {}}</tool_call>", forced_prompt(tokenizer, "get_weather"))
    body["max_tokens"] = 1  # " {" of the steered " {", "}}", "</tool_call>"
    r = small_server.openai().chat.completions.create(
        model=small_server.model, messages=USER, tools=TOOLS, tool_choice=choice, **body
    )
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == '<tool_call>\n{"name": "get_weather", "arguments": {'
