"""Engine: requests, slots, scheduler, runner, sampler.

Module map: config (EngineConfig) | context (the one place that loads models and opens llama
contexts: ContextConfig) | paging (--kv-offload / --hot-blocks: the QSA K/V a model needs, the
hot cache's default, admission against host memory) | request (Request, SamplingParams,
events) | slots (SlotTable, SlotLease) | scheduler (token budget: decode first, then prompt
chunks by the prefill policy) | runner (llama.cpp: model, tokenizer, batched forward, abort) |
sampler (numpy sampling, penalties) | grammar (draws constrained to a GBNF grammar: JSON
response formats) | detokenizer (UTF-8-safe deltas, stop strings) | prefix_cache, prefix_rows,
prefix_reuse (the prefix cache: snapshots, their rows copied off the engine thread, where a
request starts) | engine (the thread and its step loop) | start (load_engine: the model
loaded, its context warmed up, the engine thread started).
The embedded default model is built by pyqsa.demo_model.
"""

from .config import EngineConfig
from .engine import (
    AdmissionError,
    Engine,
    EngineStats,
    EngineStopped,
    PromptTooLong,
    QueueFull,
)
from .grammar import GrammarError
from .request import (
    Delta,
    Event,
    Finished,
    FinishReason,
    InvalidSamplingParam,
    SamplingParams,
    TokenLogprob,
)
from .start import load_engine

__all__ = [
    "AdmissionError",
    "Delta",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "EngineStopped",
    "GrammarError",
    "Event",
    "FinishReason",
    "Finished",
    "InvalidSamplingParam",
    "PromptTooLong",
    "QueueFull",
    "SamplingParams",
    "TokenLogprob",
    "load_engine",
]
