"""The engine thread with a fake runner: events, finish reasons, admission, cancellation."""

import dataclasses
import threading
import time

import numpy as np
import pytest
from engine_fakes import BYTES_PER_TOKEN, EOS, Collector, FakeRunner, FakeVocab

from pyqsa.engine import (
    Delta,
    Engine,
    EngineConfig,
    EngineStopped,
    FinishReason,
    PromptTooLong,
    QueueFull,
    SamplingParams,
)
from pyqsa.engine.start import warm_up
from pyqsa.native import SampleResult

GREEDY = SamplingParams(temperature=0, max_tokens=5)


def engine(runner=None, vocab=None, **kw) -> Engine:
    cfg = EngineConfig("fake.gguf", **{"n_slots": 2, "ctx_per_slot": 32, **kw})
    return Engine(cfg, runner or FakeRunner(), vocab or FakeVocab()).start()


@pytest.fixture
def stop_after():
    engines = []
    yield engines.append
    for e in engines:
        e.stop()


def test_greedy_tokens_text_and_usage(stop_after):
    runner = FakeRunner()
    e = engine(runner)
    stop_after(e)
    sink = Collector()
    e.submit([3, 4], GREEDY, sink)
    fin = sink.wait()
    assert sink.tokens == [5, 6, 7, 8, 9]
    assert sink.text == "<5><6><7><8><9>"
    assert (fin.reason, fin.prompt_tokens, fin.completion_tokens) == (FinishReason.LENGTH, 2, 5)
    assert runner.batches[0] == [(0, 0, (3, 4))]
    assert runner.batches[1] == [(0, 2, (5,))]
    assert runner.released == [0]
    s = e.stats()
    assert (s.busy_slots, s.waiting, s.in_flight, s.generated_tokens) == (0, 0, 0, 5)


def test_stop_token_and_stop_string(stop_after):
    e = engine(vocab=FakeVocab({60: b"a", 61: b"b", 62: b"c"}))
    stop_after(e)
    sink = Collector()
    e.submit([59], SamplingParams(temperature=0, max_tokens=10), sink)
    fin = sink.wait()  # 60, 61, 62, then EOS (63): stop, not shown
    assert (sink.text, fin.reason, fin.completion_tokens) == ("abc", FinishReason.STOP, 4)
    sink = Collector()
    e.submit([59], SamplingParams(temperature=0, max_tokens=10, stop=("bc",)), sink)
    fin = sink.wait()
    assert (sink.text, fin.reason, fin.completion_tokens) == ("a", FinishReason.STOP, 3)
    sink = Collector()
    e.submit([59], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), sink)
    fin = sink.wait()
    assert fin.reason is FinishReason.LENGTH and EOS in sink.tokens


def test_output_is_capped_by_the_slot_context(stop_after):
    e = engine(ctx_per_slot=8)
    stop_after(e)
    sink = Collector()
    e.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=None), sink)
    fin = sink.wait()
    assert (fin.reason, fin.completion_tokens) == (FinishReason.LENGTH, 5)


def test_admission_refusals(stop_after):
    gate = threading.Event()
    e = engine(FakeRunner(hook=lambda chunks: gate.wait()), n_slots=2, max_waiting=1)
    stop_after(e)
    with pytest.raises(PromptTooLong):
        e.submit(list(range(32)), GREEDY, Collector())
    with pytest.raises(ValueError):
        e.submit([], GREEDY, Collector())
    sinks = [Collector() for _ in range(3)]
    for s in sinks:
        e.submit([1], GREEDY, s)
    with pytest.raises(QueueFull):
        e.submit([1], GREEDY, Collector())
    gate.set()
    for s in sinks:
        assert s.wait().reason is FinishReason.LENGTH
    assert e.stats().in_flight == 0
    e.submit([1], GREEDY, Collector())  # room again


def test_cancel_while_queued(stop_after):
    gate = threading.Event()
    runner = FakeRunner(hook=lambda chunks: gate.wait())
    e = engine(runner, n_slots=1)
    stop_after(e)
    a, b = Collector(), Collector()
    e.submit([1], SamplingParams(temperature=0, max_tokens=3), a)
    rid_b = e.submit([40, 41], GREEDY, b)
    e.cancel(rid_b)
    gate.set()
    fin_b = b.wait()
    assert (fin_b.reason, fin_b.completion_tokens, b.tokens) == (FinishReason.CANCELLED, 0, [])
    assert a.wait().reason is FinishReason.LENGTH
    assert all(tokens != (40, 41) for batch in runner.batches for _, _, tokens in batch)
    assert runner.released == [0]


def test_cancel_during_prefill_drops_the_stale_result(stop_after):
    running, proceed = threading.Event(), threading.Event()

    def hook(chunks):
        if not proceed.is_set():
            running.set()
            proceed.wait()

    runner = FakeRunner(hook=hook)
    e = engine(runner, n_slots=2, max_batch_tokens=4)
    stop_after(e)
    sink = Collector()
    rid = e.submit(list(range(1, 21)), GREEDY, sink)  # 20 prompt tokens: 5 steps of 4
    assert running.wait(5)
    e.cancel(rid)  # arrives while the first chunk is being computed
    proceed.set()
    fin = sink.wait()
    assert fin.reason is FinishReason.CANCELLED
    assert not any(isinstance(ev, Delta) for ev in sink.seen)
    assert runner.batches == [[(0, 0, (1, 2, 3, 4))]]  # no second chunk was scheduled
    assert runner.released == [0]
    # the slot is leased again under a new generation; the old request left no trace
    after = Collector()
    e.submit([5], SamplingParams(temperature=0, max_tokens=1), after)
    assert after.wait().reason is FinishReason.LENGTH and after.tokens == [6]
    assert runner.batches[-1] == [(0, 0, (5,))]


def test_cancel_while_decoding_frees_the_slot(stop_after):
    third_step, proceed = threading.Event(), threading.Event()

    def hook(chunks):
        if len(runner.batches) == 3:
            third_step.set()
            proceed.wait()

    runner = FakeRunner(hook=hook)
    e = engine(runner, n_slots=2)
    stop_after(e)
    sink = Collector()
    rid = e.submit([1], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), sink)
    assert third_step.wait(5)
    e.cancel(rid)
    proceed.set()
    fin = sink.wait()
    # steps 1 and 2 produced tokens; step 3's row carried a released lease and was dropped
    assert (fin.reason, fin.completion_tokens, sink.tokens) == (FinishReason.CANCELLED, 2, [2, 3])
    assert runner.released == [0]
    s = e.stats()
    assert (s.busy_slots, s.in_flight, s.finished["cancelled"]) == (0, 0, 1)
    e.cancel(rid)  # finished ids are ignored
    assert e.stats().finished["cancelled"] == 1


def test_cancel_aborts_a_pass_of_only_cancelled_requests(stop_after):
    in_pass = threading.Event()

    def hook(chunks):
        if len(runner.batches) == 1:
            in_pass.set()
            runner.abort.wait(5)  # the pass "computes" until the abort comes

    runner = FakeRunner(hook=hook)
    e = engine(runner, n_slots=2, max_batch_tokens=4)
    stop_after(e)
    sink = Collector()
    rid = e.submit(list(range(1, 21)), GREEDY, sink)
    assert in_pass.wait(5)
    e.cancel(rid)
    fin = sink.wait()
    assert (fin.reason, fin.completion_tokens) == (FinishReason.CANCELLED, 0)
    assert runner.aborted == 1 and runner.released == [0]
    assert e.stats().busy_slots == 0
    # the abort ended with its pass: the next request runs whole
    after = Collector()
    e.submit([5], SamplingParams(temperature=0, max_tokens=2), after)
    assert after.wait().reason is FinishReason.LENGTH and after.tokens == [6, 7]
    assert runner.aborted == 1


def test_cancel_does_not_abort_a_pass_shared_with_a_live_request(stop_after):
    in_pass, proceed = threading.Event(), threading.Event()

    def hook(chunks):
        if len(chunks) == 2 and not in_pass.is_set():
            in_pass.set()
            proceed.wait(5)

    runner = FakeRunner(hook=hook)
    e = engine(runner, n_slots=2)
    stop_after(e)
    a, b = Collector(), Collector()
    e.submit([1], SamplingParams(temperature=0, max_tokens=5), a)
    rid_b = e.submit([30], SamplingParams(temperature=0, max_tokens=5), b)
    assert in_pass.wait(5)
    e.cancel(rid_b)
    assert not runner.abort.is_set()  # a's work in the pass is worth keeping
    proceed.set()
    assert b.wait().reason is FinishReason.CANCELLED
    assert a.wait().reason is FinishReason.LENGTH and a.tokens == [2, 3, 4, 5, 6]
    assert runner.aborted == 0


def test_a_failing_sink_cancels_only_its_request(stop_after):
    e = engine()
    stop_after(e)

    def broken(ev):
        raise RuntimeError("event loop closed")

    e.submit([1], GREEDY, broken)
    ok = Collector()
    e.submit([2], GREEDY, ok)
    assert ok.wait().reason is FinishReason.LENGTH
    s = e.stats()
    assert (s.in_flight, s.busy_slots, s.finished["cancelled"]) == (0, 0, 1)


def test_a_steps_events_are_delivered_when_the_next_pass_starts(stop_after):
    """A step's events reach the sinks together once the next forward pass is set up (so a
    server's event loop handles them while the device runs it), and the last ones when the
    engine runs out of work."""
    collector, got = Collector(), []

    def sink(ev):
        got.append(ev)  # (the collector's queue is read as it fills)
        collector(ev)

    delivered: list[tuple[int, int]] = []  # per pass: events delivered before, after its launch

    class Runner(FakeRunner):
        def run(self, chunks, draws=None, on_launch=None):
            before = len(got)

            def launch():
                on_launch()
                delivered.append((before, len(got)))

            return super().run(chunks, draws, launch)

    e = engine(Runner())
    stop_after(e)
    e.submit([3, 4], GREEDY, sink)
    assert collector.wait().reason is FinishReason.LENGTH
    # a prefill, then 4 decodes: each pass's launch hands over the previous step's token; the
    # 5th token and the end come when the engine idles
    assert delivered == [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4)]
    assert collector.tokens == [5, 6, 7, 8, 9]


def test_stop_cancels_everything():
    gate = threading.Event()
    e = engine(FakeRunner(hook=lambda chunks: gate.wait(0.05)), n_slots=1)
    sinks = [Collector() for _ in range(3)]
    for s in sinks:
        e.submit([1], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), s)
    e.stop()
    assert {s.wait().reason for s in sinks} == {FinishReason.CANCELLED}


def test_ledger_returns_to_its_start_and_is_exported(stop_after):
    from prometheus_client import generate_latest
    from pyqsa.server.metrics import Metrics

    steps = threading.Semaphore(0)  # the test lets the engine run one step per permit
    runner = FakeRunner(hook=lambda chunks: steps.acquire())
    e = engine(runner)
    stop_after(e)
    start = e.stats().ledger
    assert start == {"weights": 5000, "kv": 0}
    sink = Collector()
    rid = e.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=None), sink)
    steps.release(2)  # prefill, one decode; the third step then waits in the runner
    until(lambda: len(runner.batches) == 3)
    assert e.stats().ledger == {"weights": 5000, "kv": 4 * BYTES_PER_TOKEN}
    text = generate_latest(Metrics(e).registry).decode()
    assert 'pyqsa_ledger_bytes{category="kv"} 400.0' in text
    e.cancel(rid)
    steps.release(1)
    assert sink.wait().reason is FinishReason.CANCELLED
    until(lambda: e.stats().ledger == start)


def until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_step_time_is_split_into_forward_host_and_launch(stop_after):
    runner = FakeRunner(hook=lambda chunks: time.sleep(0.01))
    e = engine(runner)
    stop_after(e)
    sink = Collector()
    e.submit([1, 2], GREEDY, sink)
    sink.wait()
    until(lambda: e.stats().steps == 5)  # counted after the step's events
    s = e.stats()
    assert len(runner.batches) == 5
    assert s.step_seconds["forward"] >= 0.05 and s.step_seconds["host"] > 0
    # the runner hands over (on_launch) before its 10 ms passes: launch is a sliver of forward
    assert 0 < s.step_seconds["launch"] < 0.2 * s.step_seconds["forward"]


def test_warm_up_runs_a_prompt_and_two_decode_steps_and_leaves_the_slot_empty():
    runner = FakeRunner()
    warm_up(runner, 5, n_prompt=3)
    assert runner.batches == [[(0, 0, (5, 5, 5))], [(0, 3, (6,))], [(0, 4, (7,))]]
    assert runner.released == [0] and runner.cached == {}


def test_warm_up_of_every_slot_decodes_each_slot_count_all_of_them_twice_and_releases_them():
    runner = FakeRunner()
    warm_up(runner, 5, n_prompt=3, n_slots=3)
    assert runner.batches == [
        [(0, 0, (5, 5, 5))],
        [(1, 0, (5,)), (2, 0, (5,))],
        [(0, 3, (6,)), (1, 1, (6,)), (2, 1, (6,))],
        [(0, 4, (7,)), (1, 2, (7,)), (2, 2, (7,))],  # twice in a row: a CUDA graph is captured
        [(0, 5, (8,)), (1, 3, (8,))],
        [(0, 6, (9,))],
    ]
    assert sorted(runner.released) == [0, 1, 2] and runner.cached == {}


def test_warm_up_computes_a_chunk_of_the_prompt_beside_the_other_slots_decode_tokens():
    runner = FakeRunner()
    warm_up(runner, 5, n_prompt=3, n_slots=3, n_chunk=2)
    assert runner.batches == [
        [(0, 0, (5, 5, 5))],  # no row drawn: the prompt goes on
        [(1, 0, (5,)), (2, 0, (5,))],
        [(0, 3, (5, 5)), (1, 1, (6,)), (2, 1, (6,))],  # a loaded server's regular step
        [(0, 5, (6,)), (1, 2, (7,)), (2, 2, (7,))],
        [(0, 6, (7,)), (1, 3, (8,)), (2, 3, (8,))],
        [(0, 7, (8,)), (1, 4, (9,))],
        [(0, 8, (9,))],
    ]
    assert sorted(runner.released) == [0, 1, 2] and runner.cached == {}


@pytest.mark.parametrize("on_gpu", [True, False])
def test_load_engine_warms_up_the_largest_pass_and_every_slot_count_on_a_gpu(monkeypatch, on_gpu):
    """On a GPU the device's memory pool grows to the largest shapes a pass has had: the warm-up
    makes them before the ledger's and nvidia-smi's start figures are taken; on the CPU, whose
    passes allocate nothing that outlives them, a short prompt suffices."""
    from pyqsa.engine import start as start_mod

    seen = []

    class Runner(FakeRunner):
        def __init__(self, model, config):
            super().__init__()
            self.passes_async = on_gpu
            self.max_tokens = max(config.max_batch_tokens, config.max_prefill_tokens)

    class Model:
        eos = EOS

    monkeypatch.setattr(start_mod, "LlamaRunner", Runner)
    monkeypatch.setattr(start_mod, "Engine", lambda config, runner, model: _Started())
    monkeypatch.setattr(start_mod, "warm_up", lambda *a: seen.append(a[2:]))

    class _Started:
        def start(self):
            return self

    cfg = EngineConfig(
        "fake.gguf", n_slots=4, ctx_per_slot=1000, max_batch_tokens=64, max_prefill_tokens=512
    )
    start_mod.load_engine(cfg, Model())
    # the prefill budget's pass, and a regular step's chunk beside 3 decode tokens: 64 - 3
    assert seen == ([(512, 4, 61)] if on_gpu else [(32,)])
    seen.clear()
    start_mod.load_engine(dataclasses.replace(cfg, ctx_per_slot=300), Model())
    assert seen == ([(233, 4, 61)] if on_gpu else [(32,)])  # 294 in the slot, less the chunk


def test_warm_up_draws_on_the_device_when_the_runner_does():
    """A runner that draws where the logits are gets a draw for each pass (a None would make
    LlamaRunner detach slot 0's sampler, which the first request would attach again)."""
    draws_seen = []

    class DeviceRunner(FakeRunner):
        def __init__(self):
            super().__init__()
            self.samples_on_device = True

        def run(self, chunks, draws=None, on_launch=None):
            draws_seen.append(draws)
            rows = super().run(chunks)
            return [SampleResult(int(np.argmax(r)), float("nan"), ()) for r in rows]

    runner = DeviceRunner()
    warm_up(runner, 5, n_prompt=2)
    assert runner.batches == [[(0, 0, (5, 5))], [(0, 2, (6,))], [(0, 3, (7,))]]
    assert len(draws_seen) == 3 and all(isinstance(d[0], dict) for d in draws_seen)
    assert runner.released == [0]


def test_a_bad_request_fails_alone(stop_after):
    e = engine()
    stop_after(e)
    bad, good = Collector(), Collector()
    e.submit([1], SamplingParams(temperature=0, logit_bias={10_000: 1.0}), bad)
    e.submit([2], SamplingParams(temperature=0, max_tokens=3, seed=-5), good)
    fin = bad.wait()
    assert fin.reason is FinishReason.ERROR and "sampling failed" in fin.error
    assert good.wait().reason is FinishReason.LENGTH and good.tokens == [3, 4, 5]
    assert e.stats().busy_slots == 0


def test_an_engine_bug_fails_requests_instead_of_hanging_them():
    def explode(chunks):
        raise ZeroDivisionError("bug")

    e = engine(FakeRunner(hook=explode))
    sink = Collector()
    e.submit([1], GREEDY, sink)
    fin = sink.wait()
    assert fin.reason is FinishReason.ERROR and "bug" in fin.error
    with pytest.raises(EngineStopped):
        e.submit([1], GREEDY, Collector())
    assert e.stats().in_flight == 0
    e.stop()


@pytest.mark.parametrize("hot_blocks", [0, 8])
def test_an_engine_that_pages_lets_long_prompts_take_turns(stop_after, hot_blocks):
    """With paging every prompt chunk stages its stream's history: the scheduler's long_turns."""
    e = engine(hot_blocks=hot_blocks)
    stop_after(e)
    assert e.scheduler.long_turns is (hot_blocks > 0)
