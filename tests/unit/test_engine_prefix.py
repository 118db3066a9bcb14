"""The engine with the prefix cache, on the fake runner: where requests start, which snapshots
are taken, the counts, holding, cancel and clear. The real model's exactness is in
tests/e2e/test_server_prefix.py."""

import threading
import time

import pytest
from engine_fakes import BYTES_PER_TOKEN, Collector, FakeRunner, FakeVocab

from pyqsa.engine import Engine, EngineConfig, FinishReason, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=3)


_started: list[Engine] = []


@pytest.fixture(autouse=True)
def stop_engines():
    yield
    while _started:
        _started.pop().stop()


def engine(runner, **kw) -> Engine:
    cfg = EngineConfig(
        "fake.gguf",
        **{"n_slots": 2, "ctx_per_slot": 64, "prefix_cache_bytes": 1 << 20, **kw},
    )
    _started.append(Engine(cfg, runner, FakeVocab()).start())
    return _started[-1]


def until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def run(e: Engine, prompt, params=GREEDY):
    sink = Collector()
    e.submit(prompt, params, sink)
    return sink.wait(), sink.tokens


def lengths(e: Engine) -> list[int]:
    return sorted(en.n_tokens for en in e.prefix.cache._entries.values())


def idle(e: Engine) -> None:
    """Until the engine's own requests (a reply computed as a prompt) are done too."""
    until(lambda: e.stats().busy_slots == 0 and not e.scheduler.waiting)


def test_follow_ups_start_after_the_cached_prompt_and_reply():
    runner = FakeRunner()
    e = engine(runner)
    fin, out = run(e, [1, 2, 3, 4, 5])
    assert (out, fin.cached_tokens) == ([6, 7, 8], 0)
    idle(e)
    # the prompt's end, then the prompt and the whole reply computed as a prompt, from it
    assert lengths(e) == [5, 8]
    assert runner.restored == [(0, 5)]
    assert runner.batches[-1] == [(0, 5, (6, 7, 8))]
    runner.batches.clear()
    fin, out = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    assert fin.cached_tokens == 8
    assert runner.restored[1] == (0, 8)
    assert runner.batches[0] == [(0, 8, (20, 21))]  # only the new tokens are computed
    assert out == [22, 23, 24]
    assert (fin.prompt_tokens, fin.completion_tokens) == (10, 3)
    idle(e)
    s = e.stats()
    # the engine's own requests count in neither the hits nor the requests finished
    assert (s.prefix.hit_tokens, s.prefix.miss_tokens) == (8, 5 + 2)
    assert s.finished["length"] == 2 and s.in_flight == 0


def test_at_least_two_tokens_are_computed():
    runner = FakeRunner()
    e = engine(runner)
    run(e, [1, 2, 3, 4, 5])
    idle(e)
    runner.batches.clear()
    fin, _ = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # the 8-token entry would leave one: 5
    assert (fin.cached_tokens, runner.batches[0]) == (5, [(0, 5, (6, 7, 8, 9))])


def test_a_prompt_equal_to_a_cached_one_recomputes_its_last_token():
    runner = FakeRunner()
    e = engine(runner)
    run(e, [1, 2, 3, 4, 5])
    runner.batches.clear()
    fin, _ = run(e, [1, 2, 3, 4, 5])
    # the 5-token entry would leave nothing to compute: none shorter exists, so all of it
    assert (fin.cached_tokens, runner.batches[0]) == (0, [(0, 0, (1, 2, 3, 4, 5))])


def test_stride_snapshots_inside_a_prompt_serve_a_divergent_one():
    runner = FakeRunner()
    e = engine(runner, prefix_stride=8, max_batch_tokens=32)
    prompt = list(range(1, 21))
    run(e, prompt)
    assert [b[0][1:] for b in runner.batches[:3]] == [  # chunks end on the stride
        (0, tuple(range(1, 9))),
        (8, tuple(range(9, 17))),
        (16, tuple(range(17, 21))),
    ]
    idle(e)
    assert lengths(e) == [8, 16, 20, 23]
    runner.batches.clear()
    fin, _ = run(e, prompt[:12] + [40, 41])  # diverges at 12: the 8-token snapshot
    assert fin.cached_tokens == 8
    assert runner.batches[0] == [(0, 8, tuple(prompt[8:12]) + (40, 41))]


def test_a_held_entry_survives_clear_and_cancel_releases_it():
    steps = threading.Semaphore(0)
    runner = FakeRunner(hook=lambda chunks: steps.acquire(timeout=10))  # no hang on a failure
    e = engine(runner)
    steps.release(1)
    run(e, [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=1))  # one step, no reply
    start_ledger = e.stats().ledger
    sink = Collector()
    rid = e.submit([1, 2, 3, 4, 5, 9], SamplingParams(temperature=0, max_tokens=None), sink)
    until(lambda: len(runner.restored) == 1)  # started from the 4-token entry, now held
    (held,) = e.prefix.cache._entries.values()
    assert (held.n_tokens, held.refs) == (4, 1)
    cleared = e.clear_prefix_cache()
    steps.release(1)  # its first step ends; the clear runs before the next one
    cleared.result(5)
    # the held one is left, and the new prompt's end, taken after the clear (which ran as
    # that step's pass ended)
    assert lengths(e) == [4, 6]
    e.cancel(rid)
    steps.release(1)
    assert sink.wait().reason is FinishReason.CANCELLED
    idle(e)
    assert [en.refs for en in e.prefix.cache._entries.values()] == [0, 0]
    assert lengths(e) == [4, 6]  # kept; a cancelled request's reply is not redone
    steps.release(100)
    fin, out = run(e, [1, 2, 3, 4, 5, 9])
    assert (fin.cached_tokens, out) == (4, [10, 11, 12])
    idle(e)
    e.clear_prefix_cache().result(5)
    assert (e.stats().prefix.bytes, e.stats().prefix.entries) == (0, 0)
    assert e.stats().ledger == start_ledger


def test_tiny_budget_evicts_and_counts():
    runner = FakeRunner()
    one = BYTES_PER_TOKEN * 8 + 8 * 8  # one 8-token snapshot (state and int64 tokens)
    e = engine(runner, prefix_cache_bytes=one)
    run(e, [1, 2, 3, 4, 5])
    idle(e)
    # the reply's state does not fit beside the prompt's, held while it was computed
    assert lengths(e) == [5]
    run(e, [11, 12, 13, 14, 15])
    idle(e)
    s = e.stats().prefix
    assert (lengths(e), s.evicted, s.bytes) == ([5], 1, BYTES_PER_TOKEN * 5 + 8 * 5)
    assert e.prefix.cache.contains([11, 12, 13, 14, 15])


def test_off_without_a_budget():
    runner = FakeRunner()
    e = engine(runner, prefix_cache_bytes=0, prefix_stride=2)
    run(e, [1, 2, 3, 4, 5])
    fin, _ = run(e, [1, 2, 3, 4, 5, 6, 7])
    assert fin.cached_tokens == 0 and runner.restored == []
    assert runner.batches[0] == [(0, 0, (1, 2, 3, 4, 5))]  # no stride cuts either
    assert len(runner.batches) == 3 + 3  # no reply computed again
    s = e.stats()
    assert (s.prefix.entries, s.prefix.hit_tokens, s.prefix.miss_tokens) == (0, 0, 12)


def test_a_requests_own_snapshot_point():
    runner = FakeRunner()
    e = engine(runner, max_batch_tokens=32)
    sink = Collector()
    e.submit(list(range(1, 11)), GREEDY, sink, snapshot_at=7)
    sink.wait()
    idle(e)
    assert [b[0][1:] for b in runner.batches[:2]] == [
        (0, tuple(range(1, 8))),  # the chunk ends at the snapshot point
        (7, (8, 9, 10)),
    ]
    assert lengths(e) == [7, 10, 13]
    fin, _ = run(e, list(range(1, 8)) + [30, 31])  # shares only the first 7
    assert fin.cached_tokens == 7


def test_no_reply_computed_again_while_requests_wait_for_a_slot():
    runner = FakeRunner()
    e = engine(runner, n_slots=1)
    sinks = [Collector(), Collector()]
    e.submit([1, 2, 3, 4, 5], GREEDY, sinks[0])
    e.submit([11, 12, 13, 14, 15], GREEDY, sinks[1])  # waits for the one slot
    for s in sinks:
        s.wait()
    idle(e)
    # the first reply ended with the second request waiting: only the second's is redone
    assert lengths(e) == [5, 5, 8]
    assert e.prefix.cache.contains([11, 12, 13, 14, 15, 16, 17, 18])
