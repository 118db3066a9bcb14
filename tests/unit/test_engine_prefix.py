"""The engine with the prefix cache, on the fake runner: where requests start, which snapshots
are taken, the counts, holding, cancel and clear. The real model's exactness is in
tests/e2e/test_server_prefix.py."""

import threading
import time

from engine_fakes import BYTES_PER_TOKEN, Collector, FakeRunner, FakeVocab

from pyqsa.engine import Engine, EngineConfig, FinishReason, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=3)


def engine(runner, **kw) -> Engine:
    cfg = EngineConfig(
        "fake.gguf",
        **{"n_slots": 2, "ctx_per_slot": 64, "prefix_cache_bytes": 1 << 20, **kw},
    )
    return Engine(cfg, runner, FakeVocab()).start()


def until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def run(e: Engine, prompt, params=GREEDY):
    sink = Collector()
    e.submit(prompt, params, sink)
    return sink.wait(), sink.tokens


def test_follow_ups_start_after_the_cached_prompt_and_reply():
    runner = FakeRunner()
    e = engine(runner)
    try:
        fin, out = run(e, [1, 2, 3, 4, 5])
        assert (out, fin.cached_tokens) == ([6, 7, 8], 0)
        # snapshots: the prompt's end (5 tokens), the reply's end (7: the last token is drawn,
        # not computed)
        assert sorted(len(en.tokens) for en in e.prefix.cache._entries.values()) == [5, 7]
        runner.batches.clear()
        fin, out = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 20])
        assert fin.cached_tokens == 7
        assert runner.restored == [(0, 7)]
        assert runner.batches[0] == [(0, 7, (8, 20))]  # only the new tokens are computed
        assert out == [21, 22, 23]
        assert (fin.prompt_tokens, fin.completion_tokens) == (9, 3)
        s = e.stats().prefix
        assert (s.hit_tokens, s.miss_tokens) == (7, 5 + 2)
    finally:
        e.stop()


def test_a_prompt_equal_to_a_cached_one_recomputes_its_last_token():
    runner = FakeRunner()
    e = engine(runner)
    try:
        run(e, [1, 2, 3, 4, 5])
        runner.batches.clear()
        fin, _ = run(e, [1, 2, 3, 4, 5])
        # the 5-token entry would leave nothing to compute: none shorter exists, so all of it
        assert (fin.cached_tokens, runner.batches[0]) == (0, [(0, 0, (1, 2, 3, 4, 5))])
    finally:
        e.stop()


def test_stride_snapshots_inside_a_prompt_serve_a_divergent_one():
    runner = FakeRunner()
    e = engine(runner, prefix_stride=8, max_batch_tokens=32)
    try:
        prompt = list(range(1, 21))
        run(e, prompt)
        assert [b[0][1:] for b in runner.batches[:3]] == [  # chunks end on the stride
            (0, tuple(range(1, 9))),
            (8, tuple(range(9, 17))),
            (16, tuple(range(17, 21))),
        ]
        lengths = sorted(len(en.tokens) for en in e.prefix.cache._entries.values())
        assert lengths == [8, 16, 20, 22]
        runner.batches.clear()
        fin, _ = run(e, prompt[:12] + [40, 41])  # diverges at 12: the 8-token snapshot
        assert fin.cached_tokens == 8
        assert runner.batches[0] == [(0, 8, tuple(prompt[8:12]) + (40, 41))]
    finally:
        e.stop()


def test_a_held_entry_survives_clear_and_cancel_releases_it():
    steps = threading.Semaphore(0)
    runner = FakeRunner(hook=lambda chunks: steps.acquire())
    e = engine(runner)
    try:
        steps.release(3)
        run(e, [1, 2, 3, 4])
        start_ledger = e.stats().ledger
        entries = e.prefix.cache._entries
        sink = Collector()
        rid = e.submit([1, 2, 3, 4, 5, 6, 9], SamplingParams(temperature=0, max_tokens=None), sink)
        until(lambda: len(runner.restored) == 1)  # started from the 6-token entry, now held
        assert [en.refs for en in entries.values() if len(en.tokens) == 6] == [1]
        cleared = e.clear_prefix_cache()
        steps.release(1)  # its first step ends; the clear runs before the next one
        cleared.result(5)
        # the held one is left (the 4- and 7-token ones went), and the new prompt's end, taken
        # after the clear (which ran as that step's pass ended)
        assert sorted(len(en.tokens) for en in entries.values()) == [6, 7]
        e.cancel(rid)
        steps.release(1)
        assert sink.wait().reason is FinishReason.CANCELLED
        assert [en.refs for en in entries.values()] == [0, 0]  # released, kept, no new snapshot
        steps.release(100)
        fin, out = run(e, [1, 2, 3, 4, 5, 6, 9])
        assert (fin.cached_tokens, out) == (6, [10, 11, 12])
        e.clear_prefix_cache().result(5)
        until(lambda: e.stats().prefix.bytes == 0)
        assert e.stats().prefix.entries == 0
        assert e.stats().ledger == {**start_ledger, "host.prefix_cache": 0}
    finally:
        steps.release(100)
        e.stop()


def test_tiny_budget_evicts_and_counts():
    runner = FakeRunner()
    # room for one 5-token snapshot (state plus its int64 tokens), not two
    e = engine(runner, prefix_cache_bytes=BYTES_PER_TOKEN * 7 + 8 * 7)
    try:
        run(e, [1, 2, 3, 4, 5])  # the prompt's end is kept, then evicted by the reply's end
        s = e.stats().prefix
        assert (s.entries, s.evicted) == (1, 1)
        assert s.bytes == BYTES_PER_TOKEN * 7 + 8 * 7
        assert e.stats().ledger["host.prefix_cache"] == s.bytes
    finally:
        e.stop()


def test_off_without_a_budget():
    runner = FakeRunner()
    e = engine(runner, prefix_cache_bytes=0, prefix_stride=2)
    try:
        run(e, [1, 2, 3, 4, 5])
        fin, _ = run(e, [1, 2, 3, 4, 5, 6, 7])
        assert fin.cached_tokens == 0 and runner.restored == []
        assert runner.batches[0] == [(0, 0, (1, 2, 3, 4, 5))]  # no stride cuts either
        s = e.stats()
        assert (s.prefix.entries, s.prefix.hit_tokens, s.prefix.miss_tokens) == (0, 0, 12)
        assert "host.prefix_cache" not in s.ledger
    finally:
        e.stop()
