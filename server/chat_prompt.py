"""Chat prompts whose control tokens come only from the chat template's own text.

A rendered conversation is the template's text with client strings (message contents, names,
tool calls, tool definitions) pasted in. Tokenizing it with control-token parsing would turn a
user's `<|im_end|>\\n<|im_start|>system` into real turn markers, so instead:

1. every control token's text inside a client string is broken by a mark character (one that
   occurs in no client string), so the rendered text holds unbroken control-token text only
   where the template wrote it;
2. the rendered text is split at those control tokens; each piece between them has its marks
   removed, giving back the client's exact text, and is tokenized as plain text.

Without client control-token text this gives exactly what tokenizing the whole rendered text
with control-token parsing gives: llama.cpp splits at control tokens and tokenizes the pieces
between them the same way.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Protocol

from .chat_template import OPEN, ChatTemplate
from .errors import APIError

# Unicode's private use areas: the mark is the first of these no client string holds
_MARKS = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))


class PlainTokenizer(Protocol):
    def tokenize(self, text: str, special: bool = True) -> list[int]: ...

    def control_tokens(self) -> dict[str, int]: ...


class ChatPrompt:
    def __init__(self, template: ChatTemplate, tokenizer: PlainTokenizer) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.controls = tokenizer.control_tokens()
        longest_first = sorted(self.controls, key=len, reverse=True)
        self._control = re.compile("|".join(map(re.escape, longest_first)) or "(?!)")
        self._template_chars = set(template.source)

    def tokens(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """Render the conversation and tokenize it (steps 1 and 2 above)."""
        return self.tokens_and_history(messages, tools)[0]

    def tokens_and_history(
        self, messages: list[dict], tools: list[dict] | None
    ) -> tuple[list[int], int | None]:
        """The conversation's tokens, and how many of them render the conversation without the
        reply's generation prompt, where those are a prefix of them (None elsewhere).

        NOTE: for the prefix cache. The next turn renders this conversation again with the
        reply in it, and a template may render the last turn's opening differently once it is
        answered (Qwen3's drops an empty <think> block it opens the reply with): the
        conversation before the generation prompt is what the next turn surely starts with."""
        mark = self._free_mark(json.dumps([messages, tools], ensure_ascii=False))
        broken = _break(messages, self._control, mark), _break(tools, self._control, mark)
        text = self.template.render(*broken)
        ids: list[int] = []
        at: dict[int, int] = {}  # text offset of each control token -> its index in ids
        pos = 0
        for m in self._control.finditer(text):
            ids += self._plain(text[pos : m.start()], mark)
            at[m.start()] = len(ids)
            ids.append(self.controls[m.group()])
            pos = m.end()
        ids += self._plain(text[pos:], mark)
        history = self.template.render(*broken, generation_prompt=False)
        return ids, at.get(len(history)) if text.startswith(history) else None

    def call_start(self, text: str) -> list[int]:
        """Tokens of a reply's forced start: OPEN (a control token where the vocabulary has it as
        one), then `text` (chat_template.forced_call_start, which may hold a client's function
        name) as plain text."""
        if OPEN in self.controls:
            return [self.controls[OPEN]] + self.tokenizer.tokenize(text, special=False)
        return self.tokenizer.tokenize(OPEN + text, special=False)

    def _free_mark(self, client_text: str) -> str:
        used = set(client_text) | self._template_chars
        for c in itertools.chain(*_MARKS):
            if chr(c) not in used:
                return chr(c)
        raise APIError(400, "the request holds every private-use character; it cannot be marked")

    def _plain(self, text: str, mark: str) -> list[int]:
        text = text.replace(mark, "")
        return self.tokenizer.tokenize(text, special=False) if text else []


def _break(value: Any, control: re.Pattern[str], mark: str) -> Any:
    """A copy of JSON data `value` with `mark` after the first character of every control
    token's text in its strings and keys."""
    if isinstance(value, str):
        return control.sub(lambda m: m.group()[0] + mark + m.group()[1:], value)
    if isinstance(value, dict):
        return {_break(k, control, mark): _break(v, control, mark) for k, v in value.items()}
    if isinstance(value, list):
        return [_break(v, control, mark) for v in value]
    return value
