"""Draws constrained to a grammar (GBNF, llama.cpp's grammar sampler): a request's reply is a
sentence of the grammar, ending when it is complete (then only end-of-generation tokens are
allowed).

A draw is made as without a grammar; only when the grammar rejects that token is the row masked
to the tokens the grammar allows and drawn again with the same seed and counter, as llama.cpp's
common sampler does: checking one token costs a step of the grammar, masking the row a pass over
the whole vocabulary. So the reply follows the grammar, and its logprobs are those of the row the
token was drawn from (the masked one only after a rejection).
"""

from __future__ import annotations

import ctypes
import json

import numpy as np

# llama_token_data, field for field
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _llama():
    import llama_cpp

    return llama_cpp


class GrammarError(ValueError):
    """The grammar text does not parse."""


class Grammar:
    """The grammar state of one reply: `allows` a token, `mask` a logits row, `accept` the token
    drawn. Not thread-safe: one reply's draws are made one at a time."""

    def __init__(self, vocab: ctypes.c_void_p, text: str) -> None:
        L = _llama()
        self._free = L.llama_sampler_free  # kept: __del__ may run at interpreter exit
        self._ptr = L.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not self._ptr:
            raise GrammarError("the grammar does not parse (llama.cpp's log says where)")

    def _apply(self, data: np.ndarray) -> None:
        L = _llama()
        cur = L.llama_token_data_array(
            data.ctypes.data_as(L.llama_token_data_p), len(data), -1, False
        )
        L.llama_sampler_apply(self._ptr, ctypes.byref(cur))

    def allows(self, token: int) -> bool:
        one = np.zeros(1, _TOKEN_DATA)
        one["id"] = token
        self._apply(one)
        return bool(np.isfinite(one["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of the row with -inf at every token the grammar does not allow next."""
        data = np.empty(len(logits), _TOKEN_DATA)
        data["id"] = np.arange(len(logits), dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        self._apply(data)
        return np.ascontiguousarray(data["logit"])

    def accept(self, token: int) -> None:
        """Advance past `token`, which `allows` must have passed (llama.cpp aborts otherwise)."""
        _llama().llama_sampler_accept(self._ptr, token)

    def close(self) -> None:
        if self._ptr:
            self._free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()


def call_grammar(functions: list[tuple[str, dict | None]], named: bool, close: str) -> str:
    """GBNF of what follows a forced call's start (server/chat_template.forced_call_start): the
    one function's arguments (`named`), or one of the functions' name and its arguments, then the
    call's end, `}` and `close`. `functions`: (name, parameters schema; None: any object).
    ValueError for a schema llama.cpp's converter cannot take."""
    from llama_cpp.llama_grammar import SchemaConverter

    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    quoted = conv._format_literal  # a GBNF literal of a text
    key = quoted('"arguments"')
    alternatives = []
    try:
        for i, (name, params) in enumerate(functions):
            schema = conv.resolve_refs(params or {"type": "object"}, f"function-{i}")
            args = conv.visit(schema, f"arguments-{i}")
            if named:
                alternatives.append(f"space {args}")
            else:
                fn = quoted(json.dumps(name, ensure_ascii=False))
                alternatives.append(f'space {fn} space "," space {key} space ":" space {args}')
    except Exception as e:  # the converter raises plain exceptions on unsupported schemas
        raise ValueError(f"a tool's parameters cannot be converted to a grammar: {e}") from None
    end = f'space "}}" [ \\n]? {quoted(close)}'
    conv._add_rule("root", f"({' | '.join(alternatives)}) {end}")
    return conv.format_grammar()


def json_grammar(schema: dict | None) -> str:
    """GBNF of a JSON value: any object (response_format json_object) or one that `schema`
    describes (json_schema), by llama.cpp's converter. ValueError for a schema it cannot convert."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if schema is None:
        return JSON_GBNF
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter raises plain exceptions on unsupported schemas
        raise ValueError(f"the schema cannot be converted to a grammar: {e}") from None
