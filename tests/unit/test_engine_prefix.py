"""The engine with the prefix cache, on the fake runner: where requests start (in place in the
slot that holds their prefix, resumed there, restored elsewhere), which snapshots are taken and
what rows they share, copies of rows in flight while slots go on, the counts, holding, cancel and
clear. The fake runner checks before every pass that the slot holds exactly the request's tokens
before the chunk, and that no pass, load or release writes rows a copy is reading (its
`violations`, empty after every test). The real model's exactness is in
tests/unit/test_prefix_exact.py and tests/e2e/test_server_prefix.py."""

import threading
import time

import pytest
from engine_fakes import BYTES_PER_TOKEN, HEAD_BYTES, Collector, FakeRunner, FakeVocab

from pyqsa.engine import Engine, EngineConfig, FinishReason, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=3)
ONE = SamplingParams(temperature=0, max_tokens=1)  # one step: no reply computed again


_started: list[tuple[Engine, FakeRunner]] = []


@pytest.fixture(autouse=True)
def stop_engines():
    yield
    while _started:
        e, runner = _started.pop()
        e.stop()
        assert runner.violations == []


def engine(runner, **kw) -> Engine:
    cfg = EngineConfig(
        "fake.gguf",
        **{"n_slots": 2, "ctx_per_slot": 64, "prefix_cache_bytes": 1 << 20, **kw},
    )
    _started.append((Engine(cfg, runner, FakeVocab()).start(), runner))
    return _started[-1][0]


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
    return sorted(en.n_tokens for en in e.prefix.cache.entries())


def idle(e: Engine) -> None:
    """Until the engine's own requests (a reply computed as a prompt) are done too."""
    until(lambda: e.stats().busy_slots == 0 and not e.scheduler.waiting)


def entry_bytes(n_tokens: int) -> int:
    """An entry's own bytes: its head and its int64 tokens (rows are counted per segment)."""
    return HEAD_BYTES + 8 * n_tokens


def test_follow_ups_continue_in_the_slot_that_holds_their_prefix():
    runner = FakeRunner()
    e = engine(runner)
    fin, out = run(e, [1, 2, 3, 4, 5])
    assert (out, fin.cached_tokens) == ([6, 7, 8], 0)
    idle(e)
    # the prompt's end, then the prompt and the whole reply computed as a prompt: in the same
    # slot, resumed at the prompt's end (no rows copied back), which then holds exactly that
    assert lengths(e) == [5, 8]
    assert (runner.resumed, runner.restored) == ([(0, 5)], [])
    assert runner.batches[-1] == [(0, 5, (6, 7, 8))]
    runner.batches.clear()
    fin, out = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    assert fin.cached_tokens == 8
    assert runner.batches[0] == [(0, 8, (20, 21))]  # only the new tokens are computed
    assert out == [22, 23, 24]
    assert (fin.prompt_tokens, fin.completion_tokens) == (10, 3)
    idle(e)
    # nothing loaded for it; then its own reply resumed at its prompt's end
    assert (runner.resumed, runner.restored) == ([(0, 5), (0, 10)], [])
    s = e.stats()
    # the engine's own requests count in neither the hits nor the requests finished
    assert (s.prefix.hit_tokens, s.prefix.miss_tokens) == (8, 5 + 2)
    assert s.prefix.starts == {"continue": 1, "resume": 0, "restore": 0}
    assert s.finished["length"] == 2 and s.in_flight == 0


def test_a_follow_up_without_the_reply_resumes_the_prompts_state_in_its_slot():
    runner = FakeRunner()
    e = engine(runner)
    run(e, [1, 2, 3, 4, 5])
    idle(e)  # slot 0 holds the prompt and reply
    runner.batches.clear()
    fin, out = run(e, [1, 2, 3, 4, 5, 30, 31])
    assert (fin.cached_tokens, out) == (5, [32, 33, 34])
    idle(e)
    assert runner.resumed == [(0, 5), (0, 5), (0, 7)] and runner.restored == []
    assert runner.batches[0] == [(0, 5, (30, 31))]
    assert e.stats().prefix.starts["resume"] == 1


def test_a_follow_up_whose_slot_was_taken_is_restored_from_the_cache():
    runner = FakeRunner()
    e = engine(runner, n_slots=1)
    run(e, [1, 2, 3, 4, 5])
    idle(e)
    run(e, [40, 41, 42, 43], ONE)  # takes the one slot: what it held is emptied
    assert runner.released == [0]
    runner.batches.clear()
    fin, out = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    assert (fin.cached_tokens, out) == (8, [22, 23, 24])
    assert runner.restored == [(0, 8)]  # rows of both segments, [0, 5) and [5, 8)
    assert runner.batches[0] == [(0, 8, (20, 21))]
    assert e.stats().prefix.starts == {"continue": 0, "resume": 0, "restore": 1}


def test_the_least_recently_used_free_slot_is_taken_first():
    runner = FakeRunner()
    e = engine(runner, n_slots=3)
    run(e, [1, 2, 3, 4], ONE)  # slot 0
    a, b = Collector(), Collector()
    e.submit([11, 12, 13, 14], ONE, a)
    e.submit([21, 22, 23, 24], ONE, b)
    a.wait(), b.wait()  # slots 1 and 2, released after slot 0
    assert e.slots.held() == [0, 1, 2]
    run(e, [31, 32, 33, 34], ONE)  # no slot holds a prefix of it: slot 0 goes
    assert runner.released == [0] and e.slots.held() == [1, 2, 0]
    runner.batches.clear()
    fin, _ = run(e, [11, 12, 13, 14, 15, 16], ONE)
    assert fin.cached_tokens == 4 and runner.batches[0] == [(1, 4, (15, 16))]
    assert runner.restored == []


def test_a_slot_resumes_only_an_entry_of_its_own_rows():
    """Two slots compute one prompt side by side (which rounds otherwise than alone): the entry
    holds the rows of the slot that took it first, so the other slot's follow-up starts by a
    restore of that entry, not by mixing its head with the other slot's rows."""
    gate = threading.Event()
    # slot 0's request waits in its fourth pass (slot 1's ended in its third) until slot 1's
    # follow-up is in: that one then finds only slot 1 free
    runner = FakeRunner(lambda chunks: chunks[0].start == 8 and gate.wait(timeout=10))
    e = engine(runner)
    a, b, c = Collector(), Collector(), Collector()
    e.submit([1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=20), a)  # slot 0
    e.submit([1, 2, 3, 4, 5], GREEDY, b)  # slot 1
    b.wait()
    e.submit([1, 2, 3, 4, 5, 6, 7, 8, 40, 41], GREEDY, c)
    gate.set()
    fin = c.wait()
    (entry,) = [en for en in e.prefix.cache.entries() if en.n_tokens == 5]
    assert [s.slot for s in entry.segments] == [0]
    assert (fin.cached_tokens, c.tokens) == (5, [42, 43, 44])
    a.wait()
    idle(e)
    assert runner.restored == [(1, 5)]
    assert e.stats().prefix.starts == {"continue": 0, "resume": 0, "restore": 1}


def test_no_reply_is_computed_again_while_other_requests_run():
    """A reply's own request (its prompt and reply as a prompt) waits for no other request and
    delays none: made only when its request ends alone. The next turn then resumes the prompt's
    state in its slot and computes the reply with its new tokens."""
    runner = FakeRunner()
    e = engine(runner)
    a, b = Collector(), Collector()
    e.submit([1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=6), a)  # slot 0
    e.submit([21, 22, 23, 24], GREEDY, b)  # slot 1, ends while slot 0 runs
    a.wait(), b.wait()
    idle(e)
    assert lengths(e) == [4, 5, 11]  # a's prompt and reply again, b's prompt alone
    assert runner.resumed == [(0, 5)]
    runner.batches.clear()
    fin, out = run(e, [21, 22, 23, 24, 25, 26, 27, 30, 31])  # b's prompt, reply, new tokens
    assert (fin.cached_tokens, out) == (4, [32, 33, 34])
    assert runner.resumed[1] == (1, 4) and runner.restored == []
    assert runner.batches[0] == [(1, 4, (25, 26, 27, 30, 31))]


def test_at_least_two_tokens_are_computed():
    runner = FakeRunner()
    e = engine(runner)
    run(e, [1, 2, 3, 4, 5])
    idle(e)
    runner.batches.clear()
    fin, _ = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # slot 0 holds 8 tokens, which would leave one
    assert (fin.cached_tokens, runner.batches[0]) == (5, [(0, 5, (6, 7, 8, 9))])


def test_a_prompt_equal_to_a_cached_one_recomputes_its_last_token():
    runner = FakeRunner()
    e = engine(runner)
    run(e, [1, 2, 3, 4, 5], ONE)
    runner.batches.clear()
    fin, _ = run(e, [1, 2, 3, 4, 5])
    # the 5-token entry would leave nothing to compute: none shorter exists, so all of it, in
    # another slot (slot 0's sequence is kept for a prompt that extends it)
    assert (fin.cached_tokens, runner.batches[0]) == (0, [(1, 0, (1, 2, 3, 4, 5))])


def test_stride_snapshots_share_their_rows_and_serve_a_divergent_prompt():
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
    # each position's rows once: segments [0, 8), [8, 16), [16, 20), [20, 23)
    want = sum(entry_bytes(n) for n in (8, 16, 20, 23)) + 23 * BYTES_PER_TOKEN
    assert e.stats().prefix.bytes == want
    segments = [en.segments for en in e.prefix.cache.entries()]
    assert [(s.start, s.end) for s in max(segments, key=len)] == [
        (0, 8),
        (8, 16),
        (16, 20),
        (20, 23),
    ]
    run(e, [50, 51, 52, 53], ONE)  # slot 1
    run(e, [60, 61, 62, 63], ONE)  # slot 0, the least recently used, emptied
    runner.batches.clear()
    fin, _ = run(e, prompt[:12] + [40, 41])  # diverges at 12: the 8-token snapshot, restored
    assert fin.cached_tokens == 8 and runner.restored == [(1, 8)]
    assert runner.batches[0] == [(1, 8, tuple(prompt[8:12]) + (40, 41))]


def test_a_prompts_rows_are_copied_while_it_is_computed():
    runner = FakeRunner()
    runner.copy_gate.clear()  # the copies ahead are in flight while the prompt goes on
    e = engine(runner, prefix_rows_ahead=6, max_batch_tokens=4)
    sink = Collector()
    prompt = list(range(1, 21))
    e.submit(prompt, GREEDY, sink)
    assert sink.first.wait(5)  # the prompt went on and ended, its copies waiting
    assert runner.opened == 2  # after 8 and 16 positions, not at 4 and 12
    runner.copy_gate.set()
    sink.wait()
    idle(e)
    # the prompt's snapshot copied only [16, 20); its reply's [20, 23); each position once
    (entry,) = [en for en in e.prefix.cache.entries() if en.n_tokens == 20]
    assert [(s.start, s.end) for s in entry.segments] == [(0, 8), (8, 16), (16, 20)]
    assert e.stats().prefix.bytes == entry_bytes(20) + entry_bytes(23) + 23 * BYTES_PER_TOKEN
    run(e, [50, 51, 52, 53], ONE)  # slot 1
    run(e, [60, 61, 62, 63], ONE)  # slot 0, the least recently used, emptied
    fin, _ = run(e, prompt + [98, 99])  # restored from the rows copied ahead and at the end
    assert fin.cached_tokens == 20 and runner.restored == [(1, 20)]


def test_rows_copied_ahead_need_a_positive_interval():
    with pytest.raises(ValueError, match="prefix_rows_ahead must be >= 1, got 0"):
        EngineConfig("fake.gguf", prefix_rows_ahead=0)


def test_a_prompt_cancelled_while_its_rows_are_copied_ahead_leaves_nothing():
    hold = threading.Event()  # passes wait for it once a copy ahead was asked for
    runner = FakeRunner(hook=lambda chunks: runner.opened and hold.wait(5))
    runner.copy_gate.clear()
    e = engine(runner, n_slots=1, prefix_rows_ahead=4, max_batch_tokens=4)
    sink = Collector()
    rid = e.submit(list(range(1, 41)), GREEDY, sink)
    until(lambda: runner.opened >= 1)
    e.cancel(rid)
    hold.set()
    threading.Timer(0.2, runner.copy_gate.set).start()
    fin, _ = run(e, [70, 71, 72, 73], ONE)  # its slot emptied once the copies end
    assert fin.reason is FinishReason.LENGTH
    assert lengths(e) == [4]
    until(lambda: e.prefix.copier.pending() == 0)


def test_copies_in_flight_stall_no_slot_and_end_before_their_rows_are_written():
    runner = FakeRunner()
    runner.copy_gate.clear()  # every copy of rows waits
    e = engine(runner, n_slots=2)
    # the prompt's snapshot is copying while the request decodes and while its reply is
    # computed in its slot (positions past the copied ones); another request runs meanwhile
    fin, out = run(e, [1, 2, 3, 4, 5])
    other, _ = run(e, [30, 31, 32, 33])
    assert out == [6, 7, 8] and other.reason is FinishReason.LENGTH
    idle(e)
    assert e.prefix.copier.pending() >= 2
    assert lengths(e) == [4, 5, 7, 8]
    # a request that needs slot 0 emptied (two slots held, the least recent goes) waits for its
    # copies, which end once let go
    threading.Timer(0.2, runner.copy_gate.set).start()
    started = time.monotonic()
    fin, out = run(e, [70, 71, 72, 73], ONE)
    assert time.monotonic() - started >= 0.15 and fin.reason is FinishReason.LENGTH
    until(lambda: e.prefix.copier.pending() == 0)  # its own snapshot's too
    run(e, [80, 81, 82, 83], ONE)  # and the other slot
    fin, out = run(e, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # restored from the copied rows
    assert (fin.cached_tokens, out, runner.restored) == (8, [11, 12, 13], [(0, 8)])


def test_a_copy_whose_entries_are_gone_is_skipped():
    runner = FakeRunner()
    runner.copy_gate.clear()
    one = entry_bytes(4) + 4 * BYTES_PER_TOKEN
    e = engine(runner, prefix_cache_bytes=one, n_slots=3)
    segment = {}
    for slot, prompt in enumerate(([1, 2, 3, 4], [11, 12, 13, 14], [21, 22, 23, 24])):
        run(e, prompt, ONE)  # each evicts the one before: the first is copying, the second not
        (segment[slot],) = e.prefix.copier._pending[slot]
        if slot == 0:  # (the copier has taken the first copy up: it waits for the gate)
            until(lambda: 0 in runner.reading)
    assert [segment[i].dropped for i in range(3)] == [True, True, False]
    runner.copy_gate.set()
    until(lambda: e.prefix.copier.pending() == 0)
    assert [segment[i].data is None for i in range(3)] == [True, True, False]
    assert e.prefix.copier.copied == 2 * 4 * BYTES_PER_TOKEN  # the first and the third
    assert runner.closed_sources == 3
    assert e.prefix.cache.contains([21, 22, 23, 24]) and e.stats().prefix.bytes == one


def test_a_held_entry_survives_clear_and_cancel_releases_it():
    steps = threading.Semaphore(0)
    runner = FakeRunner(hook=lambda chunks: steps.acquire(timeout=10))  # no hang on a failure
    e = engine(runner)
    start_ledger = e.stats().ledger
    steps.release(1)
    run(e, [1, 2, 3, 4], ONE)  # one step, no reply
    sink = Collector()
    rid = e.submit([1, 2, 3, 4, 5, 9], SamplingParams(temperature=0, max_tokens=None), sink)
    until(lambda: len(runner.batches) == 2)  # continued in slot 0, the 4-token entry held
    (held,) = e.prefix.cache.entries()
    assert (held.n_tokens, held.refs) == (4, 1)
    cleared = e.clear_prefix_cache()
    steps.release(1)  # its first step ends; the clear runs before the next one
    cleared.result(5)
    # the held one is left, and the new prompt's end, taken after the clear (which ran as
    # that step's pass ended) once its first token is out
    until(lambda: lengths(e) == [4, 6])
    e.cancel(rid)
    steps.release(1)
    assert sink.wait().reason is FinishReason.CANCELLED
    idle(e)
    assert [en.refs for en in e.prefix.cache.entries()] == [0, 0]
    assert lengths(e) == [4, 6]  # kept; a cancelled request's reply is not redone
    assert e.slots.held() == []  # nor its slot: it may hold a half-computed pass
    steps.release(100)
    fin, out = run(e, [1, 2, 3, 4, 5, 9])
    assert (fin.cached_tokens, out) == (4, [10, 11, 12])
    idle(e)
    # its reply is computed from the 6-token entry, restored into slot 1: that entry's rows come
    # from the cancelled request's computation, not slot 0's, so slot 0 does not resume it
    assert runner.restored == [(0, 4), (1, 6)] and runner.resumed == []
    e.clear_prefix_cache().result(5)
    assert (e.stats().prefix.bytes, e.stats().prefix.entries) == (0, 0)
    assert e.slots.held() == [] and e.stats().ledger == start_ledger


def test_tiny_budget_evicts_and_counts():
    runner = FakeRunner()
    five = entry_bytes(5) + 5 * BYTES_PER_TOKEN
    e = engine(runner, prefix_cache_bytes=five + 100)
    run(e, [1, 2, 3, 4, 5])
    idle(e)
    # the reply's state does not fit beside the prompt's, held while it was computed
    assert lengths(e) == [5]
    run(e, [11, 12, 13, 14, 15])
    idle(e)
    s = e.stats().prefix
    assert (lengths(e), s.evicted, s.bytes) == ([5], 1, five)
    assert e.prefix.cache.contains([11, 12, 13, 14, 15])


def test_off_without_a_budget():
    runner = FakeRunner()
    e = engine(runner, prefix_cache_bytes=0, prefix_stride=2)
    run(e, [1, 2, 3, 4, 5])
    fin, _ = run(e, [1, 2, 3, 4, 5, 6, 7])
    assert fin.cached_tokens == 0 and runner.restored == runner.resumed == []
    assert runner.batches[0] == [(0, 0, (1, 2, 3, 4, 5))]  # no stride cuts either
    assert len(runner.batches) == 3 + 3  # no reply computed again
    assert runner.released == [0, 0] and e.slots.held() == []  # no slot kept
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
    fin, _ = run(e, list(range(1, 8)) + [30, 31])  # shares only the first 7: resumed there
    assert fin.cached_tokens == 7 and runner.resumed[1] == (0, 7)


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


class _GatedSnapshots(FakeRunner):
    """A runner whose snapshots wait for `gate` (and count how many were taken)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.taken = 0

    def snapshot(self, slot: int):
        assert self.gate.wait(10)
        self.taken += 1
        return super().snapshot(slot)


def test_a_prompts_first_token_leaves_before_its_snapshot_is_taken():
    runner = _GatedSnapshots()
    e = engine(runner)
    sink = Collector()
    e.submit([1, 2, 3, 4], GREEDY, sink)
    # the prompt's pass ended and its snapshot waits: the first token is out already
    assert sink.first.wait(5) and runner.taken == 0
    runner.gate.set()
    assert sink.wait().reason is FinishReason.LENGTH
    idle(e)
    assert runner.taken >= 1 and 4 in lengths(e)


def test_a_request_that_ends_at_its_first_token_is_snapshotted_before_its_slot_goes():
    runner = _GatedSnapshots()
    e = engine(runner, n_slots=1)
    sink = Collector()
    e.submit([1, 2, 3, 4], ONE, sink)  # ends in the pass that computed its prompt
    # its token is out before the snapshot its end waits for
    assert sink.first.wait(5) and runner.taken == 0
    runner.gate.set()
    assert sink.wait().reason is FinishReason.LENGTH
    idle(e)
    assert lengths(e) == [4]
    fin, _ = run(e, [1, 2, 3, 4, 5, 6], ONE)
    assert fin.cached_tokens == 4


def test_the_engine_thread_converts_no_whole_prompt_or_conversation(monkeypatch):
    """A prompt's Tokens are made from its list by the thread that submits it, and the reply
    computed again extends its prompt's: the engine thread, which every request's steps wait
    for, converts no token list (at 200K tokens one costs it ~5 ms)."""
    from pyqsa.engine import prefix_cache

    made: list[tuple[str, int]] = []
    init = prefix_cache.Tokens.__init__

    def spy(self, tokens):
        init(self, tokens)
        made.append((threading.current_thread().name, isinstance(tokens, list)))

    monkeypatch.setattr(prefix_cache.Tokens, "__init__", spy)
    runner = FakeRunner()
    e = engine(runner)
    prompt = list(range(1, 21))
    run(e, prompt)
    idle(e)
    fin, _ = run(e, prompt + [21, 22, 23, 24, 25])  # its reply (21-23) and two tokens
    assert fin.cached_tokens == 23
    idle(e)
    assert ("MainThread", True) in made and ("pyqsa-engine", False) in made  # the replies'
    assert ("pyqsa-engine", True) not in made
    assert len(lengths(e)) == 4  # both prompts' ends and both replies', found by their hashes


def test_staged_heads_are_filled_off_the_engine_thread_before_their_state_is_loaded():
    runner = FakeRunner()
    runner.stage_heads = True
    runner.fill_gate.clear()  # every head's fill waits
    e = engine(runner, n_slots=1)
    # the prompt's snapshot is taken and its fill waits: the request is answered regardless
    fin, out = run(e, [1, 2, 3, 4, 5], ONE)
    assert out == [6] and runner.filled == 0
    # a request that takes the one slot waits for the copy of its rows, which follows the fill
    threading.Timer(0.2, runner.fill_gate.set).start()
    started = time.monotonic()
    run(e, [40, 41, 42, 43], ONE)
    assert time.monotonic() - started >= 0.15 and runner.filled >= 1
    # a follow-up of the first, restored from the cache: the fake sees a zero head as a violation
    fin, out = run(e, [1, 2, 3, 4, 5, 9, 10], ONE)
    assert (fin.cached_tokens, out, runner.restored) == (5, [11], [(0, 5)])
    until(lambda: runner.filled == len(e.prefix.cache))
