"""llama.cpp's abort callback on the demo model (CPU): cancelling a request whose chunk is
running stops the pass, frees the slot, and leaves every other sequence's output unchanged."""

from __future__ import annotations

import time

import pytest
from engine_fakes import Collector

from pyqsa.engine import Engine, EngineConfig, FinishReason, SamplingParams
from pyqsa.engine.request import Request
from pyqsa.engine.runner import LlamaRunner, RunnerAborted, RunnerError
from pyqsa.engine.scheduler import Chunk
from pyqsa.engine.slots import SlotLease

GREEDY_8 = SamplingParams(temperature=0, max_tokens=8)
PROMPT_A = [(7 * i + 3) % 5000 + 100 for i in range(40)]
PROMPT_V = [(11 * i + 5) % 5000 + 100 for i in range(150)]  # 3 chunks of 64, 64, 22


def config(path: str) -> EngineConfig:
    return EngineConfig(path, n_slots=2, ctx_per_slot=256, max_batch_tokens=64, n_threads=1)


def chunk(req: Request, slot: int, start: int, n: int) -> Chunk:
    return Chunk(req, SlotLease(slot, 0, 256), start, tuple(req.tokens[start : start + n]))


def greedy_tail(runner: LlamaRunner, req: Request, slot: int, start: int, n_out: int):
    """Prefill req's prompt from `start` in one chunk, then decode n_out greedy tokens."""
    logits = runner.run([chunk(req, slot, start, len(req.tokens) - start)])
    for _ in range(n_out - 1):
        req.tokens.append(int(logits[0].argmax()))
        logits = runner.run([chunk(req, slot, len(req.tokens) - 1, 1)])
    req.tokens.append(int(logits[0].argmax()))
    return req.tokens[len(req.prompt) :]


def request(prompt: list[int]) -> Request:
    return Request("r", list(prompt), GREEDY_8, lambda ev: None, 256)


def test_an_aborted_pass_leaves_other_sequences_intact(demo_llama):
    path, model = demo_llama
    ref = LlamaRunner(model, config(path))
    a = request(PROMPT_A)
    ref.run([chunk(a, 1, 0, 20)])
    expected_a = greedy_tail(ref, a, 1, 20, 8)
    expected_w = greedy_tail(ref, request(PROMPT_V[:30]), 0, 0, 8)
    ref.close()

    r = LlamaRunner(model, config(path))
    try:
        a = request(PROMPT_A)
        r.run([chunk(a, 1, 0, 20)])  # slot 1 holds half of A's prompt
        v = request(PROMPT_V)
        r.run([chunk(v, 0, 0, 64)])
        r.request_abort()
        with pytest.raises(RunnerAborted):  # V's second chunk: past position 0, which
            r.run([chunk(v, 0, 64, 64)])  # upstream cannot roll back; the slot is released
        r.clear_abort()
        r.release(0)
        assert greedy_tail(r, a, 1, 20, 8) == expected_a
        assert greedy_tail(r, request(PROMPT_V[:30]), 0, 0, 8) == expected_w  # slot 0 clean
    finally:
        r.close()


def test_upstream_cannot_undo_an_aborted_pass_for_the_other_sequences_in_it(demo_llama):
    """Why the engine aborts only a pass of cancelled requests: llama.cpp keeps A's aborted
    chunk as if computed (a recurrent state cannot be rolled back past position 0), so A can
    neither go on nor redo the chunk."""
    import llama_cpp

    path, model = demo_llama
    r = LlamaRunner(model, config(path))
    try:
        a, v = request(PROMPT_A), request(PROMPT_V)
        r.run([chunk(a, 1, 0, 20)])
        r.request_abort()
        with pytest.raises(RunnerAborted):
            r.run([chunk(v, 0, 0, 40), chunk(a, 1, 20, 10)])
        r.clear_abort()
        assert llama_cpp.llama_memory_seq_pos_max(r.mem, 1) == 29  # not 19
        with pytest.raises(RunnerError):
            r.run([chunk(a, 1, 20, 10)])
    finally:
        r.close()


class CancellingRunner:
    """A LlamaRunner that cancels the victim's request from inside the pass holding its
    `at`-th chunk, before llama_decode starts: a cancel that arrives while the chunk runs,
    deterministically (the abort flag is then seen at the first graph node)."""

    def __init__(self, runner: LlamaRunner, victim: str, at: int) -> None:
        self.runner = runner
        self.n_vocab = runner.n_vocab
        self.samples_on_device = runner.samples_on_device
        self.victim, self.at = victim, at
        self.engine: Engine | None = None
        self.seen = 0
        self.passes: list[tuple[str, ...]] = []
        self.aborted = 0

    def run(self, chunks, draws=None, on_launch=None):
        ids = tuple(c.request.request_id for c in chunks)
        self.passes.append(ids)
        if self.victim in ids:
            self.seen += 1
            if self.seen == self.at:
                self.engine.cancel(self.victim)
        try:
            return self.runner.run(chunks, draws, on_launch)
        except RunnerAborted:
            self.aborted += 1
            raise

    def __getattr__(self, name):  # release, request_abort, clear_abort, ledger, close
        return getattr(self.runner, name)


def run_engine(demo_llama, victim_chunk: int | None, together: bool) -> tuple[list[int], object]:
    """A (greedy, 8 tokens) and V (150-token prompt); V is cancelled in the pass holding its
    victim_chunk-th chunk. together: A and V are queued before the engine starts, so they
    share every pass; else V runs alone first and A after V has ended."""
    path, model = demo_llama
    runner = CancellingRunner(LlamaRunner(model, config(path)), "v", victim_chunk or 0)
    e = Engine(config(path), runner, model)
    runner.engine = e
    try:
        a, v = Collector(), Collector()
        if victim_chunk is not None:
            e.submit(PROMPT_V, SamplingParams(temperature=0, max_tokens=8), v, request_id="v")
        if together:
            e.submit(PROMPT_A, GREEDY_8, a, request_id="a")
        e.start()
        if victim_chunk is not None:
            assert v.wait().reason is FinishReason.CANCELLED
        if not together:
            e.submit(PROMPT_A, GREEDY_8, a, request_id="a")
        assert a.wait().reason is FinishReason.LENGTH
        deadline = time.monotonic() + 5
        while e.stats().busy_slots:  # published after the step that ended A
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return a.tokens, runner
    finally:
        e.stop()
        runner.runner.close()


def test_cancel_mid_chunk_aborts_the_pass_frees_the_slot_and_keeps_other_outputs(demo_llama):
    expected, _ = run_engine(demo_llama, None, together=False)
    tokens, runner = run_engine(demo_llama, victim_chunk=2, together=False)
    assert runner.aborted == 1
    assert runner.passes[:2] == [("v",), ("v",)]  # V's third chunk never ran
    assert all("v" not in p for p in runner.passes[2:])
    assert tokens == expected


def test_cancel_in_a_shared_pass_lets_it_finish_and_keeps_other_outputs(demo_llama):
    expected, _ = run_engine(demo_llama, None, together=False)
    tokens, runner = run_engine(demo_llama, victim_chunk=2, together=True)
    assert runner.aborted == 0
    assert tokens == expected
