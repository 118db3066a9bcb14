"""The engine's start: the model loaded (unless given), its context warmed up so requests do
not pay for what runs once, and the engine thread started."""

from __future__ import annotations

from .config import EngineConfig
from .engine import Engine
from .request import Request, SamplingParams
from .runner import DEVICE_MAX_ADJUST, LlamaModel, LlamaRunner, Runner
from .sampler import Sampler
from .scheduler import Chunk
from .slots import SlotLease


def load_engine(config: EngineConfig, model: LlamaModel | None = None) -> tuple[Engine, LlamaModel]:
    """Load the model (unless given, loaded from config.model_path with config.gpu_layers on
    config.gpus), create its context, warm it up and start the engine thread."""
    if model is None:
        model = LlamaModel(config.model_path, config.gpu_layers, config.gpus, config.tensor_split)
    runner = LlamaRunner(model, config)
    if runner.passes_async:
        # the largest pass the scheduler makes, a regular step's chunk beside every other slot's
        # decode token and decode steps of each slot count (see warm_up), within the slot: the
        # prompt, its chunk, slot 0's decode tokens, one more
        room = config.ctx_per_slot - warm_up_decodes(config.n_slots) - 1
        chunk = config.max_batch_tokens - (config.n_slots - 1)
        chunk = chunk if 1 < chunk < min(runner.max_tokens, room) else 0
        n_prompt = max(1, min(runner.max_tokens, room - chunk))
        warm_up(runner, model.eos, n_prompt, config.n_slots, chunk)
    else:  # a prompt as long as a short request's, within one step and the slot
        room = config.ctx_per_slot - 2
        warm_up(runner, model.eos, max(1, min(32, config.max_batch_tokens, room)))
    return Engine(config, runner, model).start(), model


def warm_up_decodes(n_slots: int) -> int:
    """The decode steps warm_up gives slot 0: the step of every slot twice, then one of each
    smaller slot count."""
    return n_slots + 1


def warm_up(
    runner: Runner, token: int, n_prompt: int = 1, n_slots: int = 1, n_chunk: int = 0
) -> None:
    """A prompt of `n_prompt` tokens on slot 0, then (`n_slots` > 1) a one-token prompt on each
    other slot, then (`n_chunk` > 0) `n_chunk` more of slot 0's prompt beside a decode token of
    each other slot (a regular step of a loaded server), then decode steps of the first
    `n_slots`, `n_slots` - 1, ..., 1 slots, all released after, each sampled
    row with a drawn token, drawn as the engine draws (on the device when the runner does): so
    requests do not pay for what runs once, and what the device holds once requests end is what
    it held before them.
    - What runs once: numpy's lazily imported modules, llama.cpp's first decode (on CUDA also
      kernel loading and library handles, such as the ones a prefill's matrix products and
      attention use and a one-token step does not). On CPU with the demo model its engine time
      to first token went from 42 to 25 ms (medians of 5 starts), as for later requests; its
      time to its first pass from 13 to 1 ms.
    - What the device holds: on CUDA, ggml's memory pool (the temporaries of the MoE products,
      QSA attention's partial sums, the pager's miss lists) grows to the largest shapes a pass
      has had and keeps that memory. They are bounded by the pass's tokens, the selection
      budget and the slots, not by the context, so the largest pass (a chunk of the step
      budget, whose later rows select a full budget) and a step of every slot reach them.
    - What loads once: CUDA loads a kernel into device memory the first time it runs. The
      decode products have a kernel for each column count, so a decode step of each slot count
      runs; cuBLAS picks its kernels by a product's shape, so a chunk runs beside a decode
      token of every other slot, the shape of a loaded server's regular step.
    - What is captured once: ggml's CUDA backend captures a pass as a CUDA graph, whose
      instance holds device memory, at the second pass in a row with the same graph, so the
      step of every slot runs twice.
    What the device held after loads against its start, run by run, and what each of these
    changed: native/PAGING.md ("Measured")."""
    lengths = [n_prompt + n_chunk] + [1] * (n_slots - 1)
    # every decode step's token, and one more (the other slots' token beside slot 0's chunk)
    room = warm_up_decodes(n_slots) + 1
    reqs = [
        Request(f"warm-up/{slot}", [token] * n, SamplingParams(), lambda ev: None, n + room)
        for slot, n in enumerate(lengths)
    ]
    samplers = [Sampler(req.params, seed=0) for req in reqs]
    leases = [SlotLease(slot, 0, n + room) for slot, n in enumerate(lengths)]
    # each pass: (slot, tokens it computes of those the slot has not yet)
    others = [(slot, 1) for slot in range(1, n_slots)]
    passes = [[(0, n_prompt)]] + ([others] if others else [])
    passes += [[(0, n_chunk), *others]] if n_chunk else []  # a chunk beside decode tokens
    passes += [[(slot, 1) for slot in range(n_slots)]]  # the same graph twice in a row
    passes += [[(slot, 1) for slot in range(k)] for k in range(n_slots, 0, -1)]
    done = [0] * n_slots
    for plan in passes:
        chunks = []
        for slot, n in plan:
            req = reqs[slot]
            chunks.append(Chunk(req, leases[slot], done[slot], tuple(req.tokens[done[slot] :][:n])))
            done[slot] += n
        draws = None
        if runner.samples_on_device:
            draws = [
                samplers[c.lease.slot].device_draw(
                    runner.n_vocab, c.request.tokens, len(c.request.prompt), DEVICE_MAX_ADJUST
                )
                if c.sample
                else None
                for c in chunks
            ]
        sampled = [c for c in chunks if c.sample]
        for c, row in zip(sampled, runner.run(chunks, draws), strict=True):
            req = c.request
            req.tokens.append(
                samplers[c.lease.slot].next_token(row, req.tokens, len(req.prompt))[0]
            )
    for slot in range(n_slots):
        runner.release(slot)
