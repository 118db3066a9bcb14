"""The prefix cache on the demo model (8 layers, 2 QSA layers selecting 4 blocks of 4 tokens):
a follow-up served from the cache gives exactly the tokens and logprobs of an engine without
it, greedy and seeded, with and without paging (a hot cache of 8 blocks), whether it continues
in the slot that holds its prefix, resumes a cached state there or is restored from the cache
into another slot (each state's rows copied on the copier thread), and so do eight
requests sharing one cached prefix at once and an engine whose budget holds one prefix; the
ledger and the cache's bytes return to where they started once it is cleared. The prompts and
prefixes end inside blocks (150 = 37 blocks + 2), so the tail block's state is exercised too."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from engine_fakes import Collector

from pyqsa.engine import EngineConfig, SamplingParams, load_engine

STRIDE = 64
PROMPT = [int(t) for t in np.random.default_rng(28).integers(200, 20000, 150)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, logprobs=3, ignore_eos=True)
SEEDED = SamplingParams(
    temperature=0.9, top_p=0.95, seed=11, max_tokens=10, logprobs=3, ignore_eos=True
)


def new_tokens(n: int, salt: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(salt).integers(200, 20000, n)]


def start(demo_llama, budget: int, hot_blocks: int = 0, n_slots: int = 8, **kw):
    path, model = demo_llama
    config = EngineConfig(
        path,
        **{
            "n_slots": n_slots,
            "ctx_per_slot": 512,
            "max_batch_tokens": 128,
            "n_threads": 2,
            "hot_blocks": hot_blocks,
            "prefix_cache_bytes": budget,
            "prefix_stride": STRIDE,
            **kw,
        },
    )
    return load_engine(config, model)[0]


@pytest.fixture(scope="module")
def cold(demo_llama):
    e = start(demo_llama, 0)
    yield e
    e.stop()


@pytest.fixture(scope="module", params=[0, 8], ids=["unpaged", "paged"])
def warm(request, demo_llama):
    e = start(demo_llama, 64 << 20, request.param)
    yield e
    e.stop()


def submit(engine, prompt, params):
    sink = Collector()
    engine.submit(prompt, params, sink)
    return sink


def run(engine, prompt, params) -> tuple[tuple, int]:
    """((tokens, logprobs), cached tokens) of one request."""
    sink = submit(engine, prompt, params)
    return result(sink)


def idle(engine) -> None:
    """Until the engine's own requests (a reply computed as a prompt) are done too."""
    deadline = time.monotonic() + 60
    while engine.stats().busy_slots or engine.scheduler.waiting:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def result(sink: Collector) -> tuple[tuple, int]:
    fin = sink.wait(60)
    assert fin.error is None
    lps = [
        (lp.token, lp.logprob, lp.top)
        for ev in sink.seen
        if hasattr(ev, "logprobs")
        for lp in ev.logprobs
    ]
    return (tuple(sink.tokens), tuple(lps)), fin.cached_tokens


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_follow_ups_equal_an_engine_without_the_cache(warm, cold, params):
    salt = 10 * params.greedy  # new tokens of each run of the module's engines their own
    warm.clear_prefix_cache().result(10)  # no slot holds anything: slot 0 gets the prompt
    (reply, _), _ = run(warm, PROMPT, params)
    reply = list(reply)
    idle(warm)  # the reply computed as a prompt is in the cache, and in slot 0
    n = len(PROMPT)
    # in order: each follow-up's slot then holds it (and its reply computed again)
    cases = {
        "prompt + reply + new": (
            PROMPT + reply + new_tokens(20, 2 + salt),
            n + len(reply),
            "continue",
        ),
        "prompt + new": (PROMPT + new_tokens(24, 1 + salt), n, "resume"),
        # two new tokens: with paging a decode-shaped pass, resolved through the hot cache, which
        # held later positions' blocks before the resume
        "prompt + 2 new": (PROMPT + new_tokens(2, 4 + salt), n, "resume"),
        "diverges mid-prompt": (PROMPT[:100] + new_tokens(30, 3 + salt), STRIDE, "resume"),
        # slot 0 shares only 100 tokens with it now: the prompt and reply from the cache
        "restored": (PROMPT + reply + new_tokens(20, 5 + salt), n + len(reply), "restore"),
    }
    for name, (prompt, n_cached, kind) in cases.items():
        before = warm.stats().prefix.starts[kind]
        got, n_got = run(warm, prompt, params)
        assert n_got == n_cached, name
        assert got == run(cold, prompt, params)[0], name
        idle(warm)
        assert warm.stats().prefix.starts[kind] == before + 1, name


def test_eight_requests_share_one_prefix(warm, cold):
    """Eight requests start from one entry at once (one resumed in the slot that holds it, seven
    restored); each first token and its logprobs (the prefill's: later tokens of requests
    decoding side by side differ from those of one alone by the rounding of wider passes, cache
    or not; and prompt chunks computed side by side round as their pass does, so the slots must
    be those of the engine without the cache, 0..7) as without the cache."""
    warm.clear_prefix_cache().result(10)  # no slot holds anything: slot 0 gets the prompt
    run(warm, PROMPT, GREEDY)
    idle(warm)
    first = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    prompts = [PROMPT + new_tokens(10 + i, 100 + i) for i in range(8)]
    sinks = [submit(warm, p, first) for p in prompts]  # all at once, 8 slots
    got = [result(s) for s in sinks]
    idle(warm)
    assert [n for _, n in got] == [len(PROMPT)] * 8
    assert [g for g, _ in got] == [run(cold, p, first)[0] for p in prompts]
    (entry,) = [e for e in warm.prefix.cache.entries() if e.n_tokens == len(PROMPT)]
    assert entry.refs == 0
    assert warm.stats().prefix.starts["restore"] >= 7


def test_a_budget_of_one_prefix_evicts_and_changes_no_answer(demo_llama, cold):
    probe = start(demo_llama, 64 << 20, 8)
    run(probe, PROMPT, GREEDY)
    idle(probe)
    one = max(e.nbytes + sum(s.nbytes for s in e.segments) for e in probe.prefix.cache.entries())
    probe.stop()
    e = start(demo_llama, one + one // 4, 8)  # the largest snapshot, not two
    try:
        prompts = [PROMPT, PROMPT + new_tokens(20, 5), PROMPT[:90] + new_tokens(40, 6)]
        for p in prompts * 2:
            assert run(e, p, SEEDED)[0] == run(cold, p, SEEDED)[0]
            idle(e)
        s = e.stats().prefix
        assert s.evicted > 0 and s.hit_tokens > 0
        assert s.bytes <= one + one // 4
    finally:
        e.stop()


@pytest.mark.parametrize("hot_blocks", [0, 8], ids=["unpaged", "paged"])
def test_ledger_and_bytes_return_to_their_start_once_cleared(demo_llama, hot_blocks):
    e = start(demo_llama, 64 << 20, hot_blocks)
    try:
        first = e.stats()
        run(e, PROMPT, GREEDY)
        run(e, PROMPT + new_tokens(30, 7), SEEDED)
        idle(e)
        assert e.stats().prefix.bytes > 0
        assert e.stats().ledger == first.ledger  # the cache's bytes are its own figure
        e.clear_prefix_cache().result(10)
        s = e.stats()
        assert (s.prefix.bytes, s.prefix.entries) == (0, 0)
        assert s.ledger == first.ledger
    finally:
        e.stop()


class _GatedRows:
    """A snapshot's rows whose copy, and its staged head's fill, wait for `gate`."""

    def __init__(self, rows, gate) -> None:
        self.rows, self.gate = rows, gate

    @property
    def head_staged(self):
        return self.rows.head_staged

    def fill_head(self):
        assert self.gate.wait(30)
        self.rows.fill_head()

    def size(self, start, end):
        return self.rows.size(start, end)

    def get(self, start, end):
        assert self.gate.wait(30)
        return self.rows.get(start, end)

    def close(self):
        self.rows.close()


@pytest.mark.parametrize("hot_blocks", [0, 8], ids=["unpaged", "paged"])
def test_copies_in_flight_change_no_answer(demo_llama, cold, hot_blocks):
    """Snapshots' rows and staged heads copied only later: while the request decodes its reply,
    while the reply is computed again in its slot, while another request decodes and is
    cancelled (its slot waits for its copies before it is emptied); then follow-ups continue,
    resume and are restored from those rows and heads, as without the cache."""
    e = start(demo_llama, 64 << 20, hot_blocks, n_slots=2)
    gate = threading.Event()
    snapshot = e.runner.snapshot
    e.runner.snapshot = lambda slot: (lambda h, r: (h, _GatedRows(r, gate)))(*snapshot(slot))
    try:
        (reply, _), _ = run(e, PROMPT, GREEDY)
        reply = list(reply)
        idle(e)
        assert e.prefix.copier.pending() >= 4  # strides 64 and 128, the prompt, prompt + reply
        sink = submit(e, new_tokens(120, 8), SamplingParams(temperature=0, max_tokens=None))
        sink.first.wait(30)
        threading.Timer(0.3, gate.set).start()
        e.cancel(sink.events.get(timeout=30).request_id)  # its slot waits for the copies
        assert sink.wait(30).reason.value == "cancelled"
        follow = PROMPT + reply + new_tokens(20, 9)
        got, n = run(e, follow, GREEDY)
        assert n == len(PROMPT + reply) and got == run(cold, follow, GREEDY)[0]
        idle(e)
        for other in (new_tokens(40, 10), new_tokens(40, 11)):  # both slots taken: emptied
            run(e, other, SamplingParams(temperature=0, max_tokens=1))
        follow = PROMPT + reply + new_tokens(20, 12)
        got, n = run(e, follow, GREEDY)
        assert n == len(PROMPT + reply) and got == run(cold, follow, GREEDY)[0]
        assert e.stats().prefix.starts == {"continue": 1, "resume": 0, "restore": 1}
    finally:
        e.stop()


@pytest.mark.parametrize("hot_blocks", [0, 8], ids=["unpaged", "paged"])
def test_rows_copied_ahead_change_no_answer(demo_llama, hot_blocks):
    """A prompt computed in chunks of 25 has its rows copied every 40 positions or more while it
    goes on (`pyqsa_seq_rows_open`: no head), at 50 (inside a block of 4: its key comes with the
    next segment) and 100; its snapshot at 150 copies the rest: a follow-up restored from those
    rows in another slot answers as without the cache (chunked the same: a prompt's chunks round
    as their passes do)."""
    kw = {"n_slots": 2, "max_batch_tokens": 25, "prefix_stride": 4096}
    e = start(demo_llama, 64 << 20, hot_blocks, prefix_rows_ahead=40, **kw)
    plain = start(demo_llama, 0, hot_blocks, **kw)
    try:
        run(e, PROMPT, SamplingParams(temperature=0, max_tokens=1))
        (entry,) = [en for en in e.prefix.cache.entries() if en.n_tokens == len(PROMPT)]
        assert [(s.start, s.end) for s in entry.segments] == [(0, 50), (50, 100), (100, 150)]
        for other in (new_tokens(40, 13), new_tokens(40, 14)):  # both slots taken: emptied
            run(e, other, SamplingParams(temperature=0, max_tokens=1))
        follow = PROMPT + new_tokens(20, 15)
        got, n = run(e, follow, GREEDY)
        assert n == len(PROMPT) and got == run(plain, follow, GREEDY)[0]
        assert e.stats().prefix.starts["restore"] == 1
    finally:
        e.stop()
        plain.stop()


def test_the_stages_of_snapshot_heads_are_made_with_the_context(demo_llama, cold):
    """With the prefix cache on, a new engine's runner holds a head's stage for every slot before
    any request (the prompts of one pass may all end in it and take them at once, inside a step
    every slot waits for); without the cache, none."""
    e = start(demo_llama, 64 << 20)
    try:
        assert len(e.runner._stages) == e.config.n_slots
    finally:
        e.stop()
    assert cold.runner._stages == []
