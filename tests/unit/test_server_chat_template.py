"""Chat templates and Qwen tool-call parsing (pure Python, no model)."""

import json

import pytest
from pyqsa.server.chat_template import (
    ChatTemplate,
    ParsedToolCall,
    ToolCallStream,
    parse_tool_calls,
)
from pyqsa.server.errors import APIError
from pyqsa.server.qwen_template import QWEN_TEMPLATE

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def test_qwen_template_renders_tools_calls_and_results():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "R1"},
        {"role": "tool", "tool_call_id": "c", "content": "R2"},
    ]
    text = ChatTemplate(QWEN_TEMPLATE).render(messages, [TOOL])
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert json.dumps(TOOL) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n' in text
    assert (
        "<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_qwen_template_without_tools_is_plain_chatml():
    text = ChatTemplate(QWEN_TEMPLATE).render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_errors_are_client_errors():
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(APIError) as e:
        t.render([{"role": "user", "content": "x"}])
    assert e.value.status == 400 and "roles must alternate" in e.value.message


def test_parse_finished_reply():
    content, calls = parse_tool_calls("Let me check. " + CALL + CALL)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1})] * 2
    assert len({c.id for c in calls}) == 2
    bad = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(bad) == (bad, [])


def test_stream_holds_back_a_split_open_tag_and_emits_whole_calls():
    s = ToolCallStream()
    out = []
    for piece in [
        "Hi <",
        "tool_",
        'call>\n{"name": "f", ',
        '"arguments": {}}\n</tool',
        "_call> ok",
    ]:
        out += s.feed(piece)
    out.append(s.flush())
    assert out[0] == "Hi "
    assert isinstance(out[1], ParsedToolCall) and out[1].name == "f" and out[1].arguments == "{}"
    assert out[2:] == [" ok", ""]


def test_stream_releases_text_that_is_not_a_tag():
    s = ToolCallStream()
    assert s.feed("a <b") == ["a <b"]  # cannot open a tool call
    assert s.feed(" <too") == [" "]  # might
    assert s.feed("k> c") == ["<took> c"]  # did not
    assert s.feed("<tool_call>{bad}</tool_call>") == ["<tool_call>{bad}</tool_call>"]
    assert s.feed("<tool_call>{unfinished") == []
    assert s.flush() == "<tool_call>{unfinished"


REPLIES = [
    "plain text, no call at all",
    "Let me check. " + CALL,
    CALL + " then text < tool " + CALL,
    "before <tool_call>{bad}</tool_call> after",
    "text <tool_call>{unfinished",
    "a < b and <tool_ and <tool_call",
    '<tool_call>{"name": "f", "arguments": "raw"}</tool_call>',
]


def streamed(pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Content and (name, arguments) of calls, as the server streams them."""
    s = ToolCallStream()
    out = [x for p in pieces for x in s.feed(p)] + [s.flush()]
    content = "".join(x for x in out if isinstance(x, str))
    return content, [(c.name, c.arguments) for c in out if isinstance(c, ParsedToolCall)]


def whole(text: str) -> tuple[str, list[tuple[str, str]]]:
    content, calls = parse_tool_calls(text)
    return content, [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("reply", REPLIES, ids=range(len(REPLIES)))
def test_stream_split_anywhere_parses_as_the_whole_reply(reply):
    """Split at every character position (two pieces), and one character per piece."""
    content, calls = whole(reply)
    splits = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)] + [list(reply)]
    for pieces in splits:
        got_content, got_calls = streamed(pieces)
        assert got_calls == calls, pieces
        # the whole-reply parse strips content around calls; a stream cannot take back
        # what it sent, so only the stripped text must agree
        assert got_content.strip() == content.strip(), pieces
