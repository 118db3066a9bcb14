"""OpenAI request models (pydantic, strict types) and the response shapes built from events."""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from pyqsa.engine import Finished, InvalidSamplingParam, SamplingParams
from pyqsa.engine.grammar import call_grammar, json_grammar

from .chat_template import CLOSE, forced_call_start
from .errors import APIError

_SURROGATE = re.compile("[\ud800-\udfff]")
_NESTED = frozenset((str, dict, list))  # the JSON values that hold strings


def _lone_surrogate_at(value: Any, path: str) -> str | None:
    """Where in JSON data `value` a string (or key) holds a lone UTF-16 surrogate, or None.

    JSON's "\\ud800" escape, or the raw bytes ED A0 80 (Python's json decodes both the same
    way), gives a str that cannot be encoded as UTF-8, so it could never be tokenized.
    """
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{path}.{k}"
            if (hit := _lone_surrogate_at(k, where + " (a key)")) or (
                hit := _lone_surrogate_at(v, where)
            ):
                return hit
    # NOTE: a prompt of token ids is a list of 200K ints: only its strings and containers are
    # looked into (one pass in C finds whether it has any), and their paths made only for them
    if isinstance(value, list) and not _NESTED.isdisjoint(map(type, value)):
        for i, v in enumerate(value):
            if type(v) in _NESTED and (hit := _lone_surrogate_at(v, f"{path}.{i}")):
                return hit
    return None


class _Model(BaseModel):
    # NOTE: strict: "1" is not an int and "true" not a bool, as in OpenAI's API; unknown
    # fields are accepted and ignored, as clients send vendor extras. JSON's NaN and
    # Infinity literals, which Python's json accepts, are no numbers here.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class TextPart(_Model):
    type: Literal["text"]
    text: str


class FunctionCall(_Model):
    name: str
    arguments: str


class ToolCall(_Model):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        """An image or audio part gets a 400 that says so (not one about strings)."""
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    what = f'of type "{kind}"' if isinstance(kind, str) else "not a text part"
                    raise PydanticCustomError(
                        "content_part",
                        "content part {i} is {what}; the model reads text parts only",
                        {"i": i, "what": what},
                    )
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDef


class JsonSchema(_Model):
    name: str
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    def grammar(self) -> str | None:
        """GBNF the reply must follow: any JSON object, or the schema's; None for text."""
        if self.type == "text":
            return None
        if self.type == "json_schema" and self.json_schema is None:
            raise APIError(
                400, 'a "json_schema" response_format needs json_schema', param="response_format"
            )
        schema = self.json_schema.schema_ if self.type == "json_schema" else None
        try:
            return json_grammar(schema)
        except ValueError as e:
            raise APIError(400, f"response_format: {e}", param="response_format") from e


class StreamOptions(_Model):
    include_usage: bool = False


Probability = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]


class _Sampling(_Model):
    """Fields shared by both endpoints; top_k, min_p, repetition_penalty, ignore_eos and
    stop_token_ids are the usual vLLM / llama-server extensions."""

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any, info: Any) -> Any:
        if where := _lone_surrogate_at(value, info.field_name):
            raise PydanticCustomError(
                "invalid_unicode",
                "the string at {where} holds a lone UTF-16 surrogate; text must be valid Unicode",
                # NOTE: pydantic renders messages as UTF-8: the path's surrogate is escaped
                {"where": where.encode("utf-8", "backslashreplace").decode()},
            )
        return value

    # OpenAI's schema types these "number or null" (boolean or null, ...), and clients built on
    # it send explicit nulls: null takes the field's default
    @field_validator(
        "temperature",
        "top_p",
        "n",
        "stream",
        "presence_penalty",
        "frequency_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "logprobs",
        "echo",
        "best_of",
        "parse_special",
        mode="before",
        check_fields=False,
    )
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        return cls.model_fields[info.field_name].default if value is None else value

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    seed: int | None = None
    user: str | None = None
    top_k: Annotated[int, Field(ge=0)] = 0
    min_p: Probability = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling(
        self, n_vocab: int, max_tokens: int, logprobs: int | None, grammar: str | None = None
    ) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4 or any(not s for s in stop):
            raise APIError(400, "'stop' takes up to 4 non-empty strings", param="stop")
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            # NOTE: ASCII digits only (int() also takes "+5", " 5", "5_0" and "٣", Arabic 3),
            # and not many (int() refuses over 4300 digits)
            if not (key.isascii() and key.isdigit() and len(key) < 10) or int(key) >= n_vocab:
                raise APIError(400, f"logit_bias: {key!r} is not a token id", param="logit_bias")
            bias[int(key)] = value
        for t in self.stop_token_ids or []:
            if not 0 <= t < n_vocab:
                raise APIError(
                    400, f"stop_token_ids: {t} is not a token id", param="stop_token_ids"
                )
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                min_p=self.min_p,
                seed=self.seed,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                repetition_penalty=self.repetition_penalty,
                logit_bias=bias,
                stop=tuple(stop),
                stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                logprobs=logprobs,
                grammar=grammar,
            )
        except InvalidSamplingParam as e:
            raise APIError(400, str(e), param=e.param) from e


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, value: Any, info: Any) -> Any:
        """As OpenAI's: a named function must be one of `tools`, and "required" needs tools."""
        names = {t.function.name for t in info.data.get("tools") or []}
        if isinstance(value, dict):
            fn = value.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if value.get("type") != "function" or not isinstance(name, str):
                raise PydanticCustomError(
                    "tool_choice",
                    'a named tool_choice is {"type": "function", "function": {"name": ...}}',
                )
            if name not in names:
                raise PydanticCustomError(
                    "tool_choice",
                    "tool_choice names {name}, which is not among the tools",
                    {"name": name},
                )
        elif value == "required" and not names:
            raise PydanticCustomError("tool_choice", 'tool_choice "required" needs tools')
        return value

    def params(self, n_vocab: int, default_max_tokens: int) -> SamplingParams:
        limit = self.max_completion_tokens or self.max_tokens or default_max_tokens
        grammar = self.response_format.grammar() if self.response_format else None
        if self.forced_call() is not None:
            if grammar is not None:
                raise APIError(
                    400,
                    "a JSON response_format and a tool_choice forcing a call exclude each other",
                    param="response_format",
                )
            grammar = self.call_grammar()
        lp = (self.top_logprobs or 0) if self.logprobs else None
        return self.sampling(n_vocab, limit, lp, grammar)

    def call_grammar(self) -> str | None:
        """GBNF of a forced call's rest (its function's name when "required", the arguments as
        the function's parameters schema says, the call's end); None when llama.cpp's converter
        cannot take a schema: the call is then forced by its start alone."""
        named = isinstance(self.tool_choice, dict)
        functions = [
            (t.function.name, t.function.parameters)
            for t in self.tools or []
            if not named or t.function.name == self.tool_choice["function"]["name"]
        ]
        try:
            return call_grammar(functions, named, CLOSE)
        except ValueError:
            return None

    def use_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def forced_call(self) -> str | None:
        """The start a reply must have (after the call marker) under tool_choice "required" or a
        named function; None when the model may answer as it likes."""
        if not self.use_tools():
            return None
        if isinstance(self.tool_choice, dict):
            return forced_call_start(self.tool_choice["function"]["name"])
        return forced_call_start(None) if self.tool_choice == "required" else None


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[int], Field(min_length=1)] | list[str]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: Literal[False] = False
    suffix: None = None
    best_of: Literal[1] = 1  # like n: one completion per request

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_prompt(cls, value: Any, handler: Any) -> Any:
        """A batch of token-id lists, or anything else that is no prompt, gets a 400 that names
        the accepted forms (not one about strings)."""
        types = set(map(type, value)) if isinstance(value, list) else set()
        if value and types == {int}:
            # NOTE: a list of token ids is whole once this one pass has seen its types: the
            # union below would check each id again, and the surrogate check look at each (most
            # of the 17 ms that validating 200K ids took here); token_ids checks their range
            return value
        one = isinstance(value, str) or (
            isinstance(value, list) and (types <= {int} or all(isinstance(t, str) for t in value))
        )
        if not one:
            raise PydanticCustomError(
                "prompt",
                "prompt is a string, a list of token ids or a list of one string (one prompt "
                "per request)",
            )
        return handler(value)

    # extension: parse control tokens (<|im_start|>...) in a string prompt; off, so text from
    # an untrusted source cannot forge turns unless the caller says it is trusted
    parse_special: bool = False

    def params(self, n_vocab: int, default_max_tokens: int) -> SamplingParams:
        return self.sampling(n_vocab, self.max_tokens or default_max_tokens, self.logprobs)


def token_ids(prompt: list[int], n_vocab: int) -> np.ndarray:
    """A prompt of token ids (CompletionRequest checked their types) as an int64 array; a 400
    for an id outside the vocabulary. An empty prompt is the engine's 400.

    NOTE: the one conversion of the ids: numpy checks their range (min and max of a 200K list
    took 8 ms here) and the prefix cache hashes the array as it is (Engine.submit's `ids`).
    """
    try:
        ids = np.array(prompt, np.int64)
    except OverflowError:  # beyond int64
        ids = None
    if ids is None or ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        raise APIError(400, "prompt: token id out of range", param="prompt")
    return ids


# -- responses -------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(fin: Finished) -> dict:
    """OpenAI's usage object of a finished request; cached_tokens: the prompt tokens whose state
    came from the prefix cache."""
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


class Shaper:
    """Builds the JSON objects of one response (shared id, timestamp and model name)."""

    def __init__(self, kind: Literal["chat", "text"], model: str) -> None:
        self.kind = kind
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())
        self.model = model

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def chunk(self, choice: dict | None, with_usage: bool = False, usage_: dict | None = None):
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        out = self._envelope(obj, [] if choice is None else [{"index": 0, **choice}])
        if with_usage:
            out["usage"] = usage_
        return out

    def final(self, choice: dict, usage_: dict) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        out = self._envelope(obj, [{"index": 0, **choice}])
        out["usage"] = usage_
        return out
