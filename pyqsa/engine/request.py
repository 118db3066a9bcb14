"""Requests, sampling parameters and the typed events a request streams back.

A request is its token list catching up: `num_computed_tokens` of `tokens` are in the slot's
cache; the scheduler feeds the rest in chunks (a prompt) or one at a time (decode). There are
no separate prefill and decode phases.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .slots import SlotLease

if TYPE_CHECKING:
    from .grammar import Grammar


class FinishReason(str, enum.Enum):
    STOP = "stop"  # a stop token or stop string
    LENGTH = "length"  # max_tokens or the slot's context is full
    CANCELLED = "cancelled"
    ERROR = "error"


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# NOTE: below these (and above 0) a logit divided or multiplied by the value can overflow to
# inf, and the draw to NaN; nothing useful lies beyond them anyway.
MIN_TEMPERATURE = 1e-3
REPETITION_PENALTY_RANGE = (1e-2, 1e2)


class InvalidSamplingParam(ValueError):
    """A SamplingParams field out of range; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling; temperature 0 is greedy. Checked on construction."""

    max_tokens: int | None = 16  # None: until the slot's context is full
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI: over generated tokens
    frequency_penalty: float = 0.0  # OpenAI: over generated tokens
    repetition_penalty: float = 1.0  # HF / llama.cpp: over prompt and generated tokens
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; n: the chosen token plus the top n
    grammar: str | None = None  # GBNF the reply must be a sentence of (pyqsa.engine.grammar)

    def __post_init__(self) -> None:
        def check(ok: bool, param: str, rule: str) -> None:
            if not ok:
                raise InvalidSamplingParam(param, f"must be {rule}, got {getattr(self, param)}")

        lo, hi = REPETITION_PENALTY_RANGE
        check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", ">= 1")
        check(
            self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf,
            "temperature",
            f"0 or at least {MIN_TEMPERATURE}",
        )
        check(0 < self.top_p <= 1, "top_p", "in (0, 1]")
        check(self.top_k >= 0, "top_k", ">= 0")
        check(0 <= self.min_p <= 1, "min_p", "in [0, 1]")
        check(lo <= self.repetition_penalty <= hi, "repetition_penalty", f"in [{lo}, {hi}]")
        for name in ("presence_penalty", "frequency_penalty"):
            check(math.isfinite(getattr(self, name)), name, "finite")
        if any(not math.isfinite(b) for b in self.logit_bias.values()):
            raise InvalidSamplingParam("logit_bias", "values must be finite")
        if any(s == "" for s in self.stop):
            raise InvalidSamplingParam("stop", "strings must not be empty")
        check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "in [0, 20]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob), best first


@dataclass(frozen=True)
class Delta:
    """New output: `text` is complete UTF-8 and never part of a stop string."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    """The last event of every request, whatever ended it."""

    request_id: str
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    text: str = ""  # final text not yet sent as a Delta (held back for stop strings)
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens whose state came from the prefix cache


Event = Delta | Finished
EventSink = Callable[[Event], None]


@dataclass(eq=False)
class Request:
    """Engine-side state of one request; touched only by the engine thread."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    sink: EventSink
    max_len: int  # prompt + output never exceed this (slot context, max_tokens)
    tokens: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    state: RequestState = RequestState.WAITING
    lease: SlotLease | None = None
    arrival: int = 0  # submission order, for FCFS
    grammar: Grammar | None = None  # params.grammar's state, made at submission
    cached_tokens: int = 0  # prompt tokens whose state the slot took from the prefix cache
    # a request of the engine's own that computes the finished request of this id's prompt and
    # reply as a prompt, for the prefix cache (prefix_reuse.py); None for a client's request
    reply_of: str | None = None
    snapshot_at: int | None = None  # a prompt length the prefix cache also snapshots

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def num_pending(self) -> int:
        """Tokens known but not yet in the cache: the prompt tail, or the last sampled token."""
        return len(self.tokens) - self.num_computed_tokens
