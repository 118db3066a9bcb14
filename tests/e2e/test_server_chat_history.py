"""ChatPrompt.tokens_and_history: the part of a chat prompt the next turn surely starts with
(the conversation before the reply's generation prompt), which the server has the prefix cache
snapshot; with the embedded Qwen template and with one that opens replies with an empty
<think> block it drops from answered turns, as Qwen3's does with thinking off."""

from __future__ import annotations

from pyqsa.server.chat_prompt import ChatPrompt
from pyqsa.server.chat_template import ChatTemplate
from pyqsa.server.qwen_template import QWEN_TEMPLATE

THINK_OFF = QWEN_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}",
)
TURN_1 = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is a prefix cache?"},
]
TURN_2 = [
    *TURN_1,
    {"role": "assistant", "content": "Saved prompt state."},
    {"role": "user", "content": "And why?"},
]


def test_the_next_turn_starts_with_the_conversation_before_the_generation_prompt(tokenizer):
    assert THINK_OFF != QWEN_TEMPLATE
    for source, opening in (
        (QWEN_TEMPLATE, "<|im_start|>assistant\n"),
        (THINK_OFF, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ):
        chat = ChatPrompt(ChatTemplate(source), tokenizer)
        first, history = chat.tokens_and_history(TURN_1, None)
        assert first[history:] == tokenizer.tokenize(opening, special=True)
        second, _ = chat.tokens_and_history(TURN_2, None)
        assert second[:history] == first[:history]
        # the whole first prompt starts the second only where the opening is kept
        assert (second[: len(first)] == first) == (source == QWEN_TEMPLATE)


def test_no_history_where_the_template_adds_no_generation_prompt(tokenizer):
    source = QWEN_TEMPLATE.replace("add_generation_prompt", "false")
    tokens, history = ChatPrompt(ChatTemplate(source), tokenizer).tokens_and_history(TURN_1, None)
    assert history is None and tokens
