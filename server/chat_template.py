"""Chat templates (Jinja, from the GGUF's `tokenizer.chat_template`) and Qwen tool calls.

Qwen models call tools by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
`parse_tool_calls` reads a finished reply, `ToolCallStream` does the same incrementally and
holds back text that may open a tool call, so no part of a call is streamed as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import APIError


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


class ChatTemplate:
    """A Jinja chat template rendered as transformers does (sandboxed, trimmed blocks)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = True
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=generation_prompt,
                **self._specials,
            )
        except TemplateError as e:
            raise APIError(400, f"the chat template rejected the messages: {e}") from e


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI returns it

    def to_openai(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def _parse_one(body: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ParsedToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], args_text)


def forced_call_start(name: str | None) -> str:
    """The text after OPEN that a reply which must call a tool starts with: up to the function's
    name (tool_choice "required": the model names one) or up to its arguments (a named
    tool_choice), in the form Qwen's templates write calls, left for the model to complete. It
    ends before the space that would follow, which the model writes together with what comes
    next, as its tokenizer pairs them."""
    if name is None:
        return '\n{"name":'
    return '\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """Split a finished reply into content and tool calls; malformed calls stay content."""
    calls: list[ParsedToolCall] = []

    def take(m: re.Match[str]) -> str:
        call = _parse_one(m.group(1))
        if call is None:
            return m.group(0)
        calls.append(call)
        return ""

    content = _CALL.sub(take, text)
    return (content.strip() if calls else content), calls


class ToolCallStream:
    """Incremental `parse_tool_calls`: feed text deltas, get content text and finished calls."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, text: str) -> list[str | ParsedToolCall]:
        self._buf += text
        out: list[str | ParsedToolCall] = []
        while self._buf:
            start = self._buf.find(OPEN)
            if start < 0:
                keep = _open_prefix_len(self._buf)
                if len(self._buf) > keep:
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                break
            if start > 0:
                out.append(self._buf[:start])
                self._buf = self._buf[start:]
            end = self._buf.find(CLOSE)
            if end < 0:
                break  # inside a call: wait for the rest
            raw = self._buf[: end + len(CLOSE)]
            self._buf = self._buf[end + len(CLOSE) :]
            call = _parse_one(raw[len(OPEN) : -len(CLOSE)])
            out.append(raw if call is None else call)
        return [x for x in out if x != ""]

    def flush(self) -> str:
        """Held text at the end of the reply (an unfinished call is plain content)."""
        text, self._buf = self._buf, ""
        return text


def _open_prefix_len(text: str) -> int:
    for k in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0
