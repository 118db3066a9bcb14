import math
import random
import sys
from pathlib import Path

import pytest

from pyqsa.engine import SamplingParams
from pyqsa.engine.request import Request, RequestState
from pyqsa.engine.scheduler import PREFILL_POLICIES, Scheduler, fair_shares, fcfs_shares
from pyqsa.engine.slots import SlotTable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from prefill_sim import split_equal  # noqa: E402


def req(rid: str, n_prompt: int, max_len: int = 100) -> Request:
    return Request(rid, list(range(1, n_prompt + 1)), SamplingParams(), lambda ev: None, max_len)


def plan(chunks):
    return [(c.request.request_id, c.lease.slot, c.start, len(c.tokens), c.sample) for c in chunks]


def advance(chunks, new_token: int = 7):
    """What the engine does after a step: mark computed, append a token where sampled."""
    for c in chunks:
        c.request.num_computed_tokens += len(c.tokens)
        if c.sample:
            c.request.tokens.append(new_token)


def test_fcfs_decode_first_then_the_oldest_prompt_takes_the_rest():
    released: list[int] = []
    s = Scheduler(SlotTable(3, 100, released.append), max_batch_tokens=8, policy="fcfs")
    a, b = req("a", 3), req("b", 20)
    s.add(a)
    s.add(b)
    step = s.schedule()
    assert plan(step) == [("a", 0, 0, 3, True), ("b", 1, 0, 5, False)]
    advance(step)
    step = s.schedule()
    # a decodes one token first; b's prompt gets the remaining 7
    assert plan(step) == [("a", 0, 3, 1, True), ("b", 1, 5, 7, False)]
    advance(step)
    c = req("c", 2)
    s.add(c)
    step = s.schedule()  # c got slot 2 but no budget this step
    # b takes one token fewer than the 7 left: its last one is never a chunk on its own
    assert plan(step) == [("a", 0, 4, 1, True), ("b", 1, 12, 6, False)]
    assert c.lease.slot == 2
    advance(step)
    step = s.schedule()
    assert plan(step) == [("a", 0, 5, 1, True), ("b", 1, 18, 2, True), ("c", 2, 0, 2, True)]
    assert released == []


def test_waiting_requests_get_slots_in_arrival_order_as_slots_free():
    released: list[int] = []
    s = Scheduler(SlotTable(1, 100, released.append), max_batch_tokens=4)
    a, b, c = req("a", 1), req("b", 1), req("c", 1)
    for r in (a, b, c):
        s.add(r)
    assert plan(s.schedule()) == [("a", 0, 0, 1, True)]
    assert [r.request_id for r in s.waiting] == ["b", "c"]
    s.finish(a)
    assert released == [0] and a.state is RequestState.FINISHED
    step = s.schedule()
    assert plan(step) == [("b", 0, 0, 1, True)]
    assert b.lease.generation == 1
    s.finish(c)  # cancelled while queued: no slot to release
    assert released == [0] and not s.waiting
    s.finish(c)  # idempotent
    assert released == [0]


def test_shares():
    # 3 fits an equal share of 50 and gets it all; the others split the 47 left equally,
    # the odd token stays unused (equal chunks make one ubatch)
    assert fair_shares([100, 3, 100], 50) == [23, 3, 23]
    assert fair_shares([10, 10], 50) == [10, 10]
    assert fair_shares([1000] * 3, 250) == [83, 83, 83]
    assert fair_shares([5, 40, 9], 30) == [5, 16, 9]
    assert fcfs_shares([30, 100, 5], 50) == [30, 20, 0]


def test_fair_every_prompt_progresses_and_decode_goes_first():
    s = Scheduler(SlotTable(4, 100, lambda slot: None), max_batch_tokens=16)
    a, b, c = req("a", 40), req("b", 2), req("c", 30)
    for r in (a, b, c):
        s.add(r)
    step = s.schedule()
    assert plan(step) == [("a", 0, 0, 7, False), ("b", 1, 0, 2, True), ("c", 2, 0, 7, False)]
    advance(step)
    d = req("d", 3)
    s.add(d)
    step = s.schedule()  # b decodes; d's 3 fit an equal share of 15; a and c split the 12 left
    assert plan(step) == [
        ("a", 0, 7, 6, False),
        ("b", 1, 2, 1, True),
        ("c", 2, 7, 6, False),
        ("d", 3, 0, 3, True),
    ]


@pytest.mark.parametrize("policy", list(PREFILL_POLICIES))
def test_decode_first_for_a_younger_request_while_an_older_prompt_fills_the_step(policy):
    s = Scheduler(SlotTable(2, 1000, lambda slot: None), max_batch_tokens=8, policy=policy)
    old, young = req("old", 500, 1000), req("young", 2, 1000)
    s.add(old)
    s.add(young)
    s.schedule()  # both get slots; young's prompt was computed earlier, as with a shorter old
    young.num_computed_tokens = 2
    young.tokens.append(7)
    for _ in range(20):
        step = s.schedule()
        assert plan(step)[1] == ("young", 1, young.num_computed_tokens, 1, True)
        assert plan(step)[0][3] == 7  # the older prompt gets all the rest
        advance(step)


def test_chunks_are_in_slot_order_and_equal_one_ubatch_for_the_prompts():
    s = Scheduler(SlotTable(4, 1000, lambda slot: None), max_batch_tokens=64)
    reqs = [req(str(i), 500, 1000) for i in range(4)]
    for r in reqs:
        s.add(r)
    step = s.schedule()
    assert [c.lease.slot for c in step] == [0, 1, 2, 3]
    batch = [(c.lease.slot, len(c.tokens)) for c in step]
    assert split_equal(batch, 64) == [[(0, 16), (1, 16), (2, 16), (3, 16)]]
    s.finish(reqs[0])
    s.add(req("new", 1))  # takes slot 0, decodes from the next step on
    advance(step)
    advance(s.schedule())
    step = s.schedule()
    batch = [(c.lease.slot, len(c.tokens)) for c in step]
    assert batch == [(0, 1), (1, 21), (2, 21), (3, 21)]
    # the decode token's pass, then one pass for the three prompts
    assert split_equal(batch, 64) == [[(0, 1), (1, 1), (2, 1), (3, 1)], [(1, 20), (2, 20), (3, 20)]]


def test_with_paging_long_prompts_take_turns_at_one_share():
    """long_turns (the engine sets it when it pages): the prompts longer than the budget count
    as one prompt of the fair split, whose share goes to each of them in turn."""
    s = Scheduler(SlotTable(4, 1000, lambda slot: None), max_batch_tokens=8, long_turns=True)
    for name in "abc":
        s.add(req(name, 100, 1000))
    got = []
    for _ in range(4):
        step = s.schedule()
        got.append(plan(step))
        advance(step)
    assert got == [
        [("a", 0, 0, 8, False)],
        [("b", 1, 0, 8, False)],
        [("c", 2, 0, 8, False)],
        [("a", 0, 8, 8, False)],
    ]
    s.add(req("d", 3))  # a short prompt: its share of the split, the long ones' turn the rest
    assert plan(s.schedule()) == [("b", 1, 8, 5, False), ("d", 3, 0, 3, True)]


def test_long_turns_apply_to_the_fair_policy_only():
    s = Scheduler(SlotTable(2, 1000, lambda slot: None), 8, "fcfs", long_turns=True)
    s.add(req("a", 100, 1000))
    s.add(req("b", 100, 1000))
    assert plan(s.schedule()) == [("a", 0, 0, 8, False)]
    assert not s.long_turns


TURNS = [(p, False) for p in PREFILL_POLICIES] + [("fair", True)]


@pytest.mark.parametrize("policy,turns", TURNS)
def test_a_short_prompt_behind_long_ones_gets_its_first_token_within_a_few_steps(policy, turns):
    n_slots, budget = 8, 64
    s = Scheduler(SlotTable(n_slots, 10_000, lambda slot: None), budget, policy, long_turns=turns)
    for i in range(7):
        s.add(req(f"long{i}", 2000, 3000))
    for _ in range(5):
        advance(s.schedule())
    short = req("short", 20)
    s.add(short)
    steps = 0
    while short.num_output_tokens == 0:
        advance(s.schedule())
        steps += 1
    bound = math.ceil(20 / (budget // n_slots))  # see the scheduler's docstring
    if turns:  # the long ones count as one prompt: the short one is one of two
        assert steps <= math.ceil(20 / (budget // 2))
    elif policy == "fair":
        assert steps <= bound
    else:  # the oldest prompts take the whole budget until their prefill is done
        assert steps > 7 * 2000 // budget - 5


@pytest.mark.parametrize("policy,turns", TURNS)
def test_no_starvation_over_a_long_mixed_run(policy, turns):
    rng = random.Random(11)
    n_slots, budget = 4, 16
    s = Scheduler(SlotTable(n_slots, 10_000, lambda slot: None), budget, policy, long_turns=turns)
    reqs: list[Request] = []
    arrived: dict[str, int] = {}
    admitted: dict[str, int] = {}
    done: dict[str, int] = {}
    for i in range(3000):
        if rng.random() < 0.15:  # ~12 tokens of work a step against a budget of 16
            r = req(f"r{i}", rng.choice([1, 2, 5, 30, 300]), 0)
            r.max_len = len(r.prompt) + rng.randint(1, 20)
            s.add(r)
            reqs.append(r)
            arrived[r.request_id] = i
        step = s.schedule()
        planned = {c.request.request_id: len(c.tokens) for c in step}
        assert sum(planned.values()) <= budget
        running = list(s.running)
        left = budget - sum(r.num_pending == 1 for r in running)  # for the prompts
        for r in running:
            admitted.setdefault(r.request_id, i)
            if r.num_pending == 1:
                assert planned[r.request_id] == 1  # decode first, every step, any age
            elif policy == "fair" and not (turns and r.num_pending > left):
                share = min(r.num_pending, budget // n_slots)
                # one fewer where the share would leave a last token on its own
                assert planned[r.request_id] >= share - (r.num_pending - share == 1)
        advance(step)
        for r in running:
            if len(r.tokens) >= r.max_len:
                s.finish(r)
                done[r.request_id] = i
    assert all(r.request_id in done for r in reqs if arrived[r.request_id] < 2000)
    assert len(done) > 300
    if policy == "fair" and not turns:  # from its slot: >= budget // slots a step, then decode
        for r in reqs:
            if r.request_id in done:
                n_out = r.max_len - len(r.prompt)
                bound = math.ceil(len(r.prompt) / (budget // n_slots)) + n_out - 1
                assert done[r.request_id] - admitted[r.request_id] + 1 <= bound


def test_a_step_of_long_prompts_only_takes_the_prefill_budget():
    s = Scheduler(SlotTable(3, 1000, lambda slot: None), max_batch_tokens=8, max_prefill_tokens=32)
    a, b = req("a", 100), req("b", 20)
    for r in (a, b):
        s.add(r)
    step = s.schedule()  # only prompts, each longer than a step: the larger budget, fairly shared
    assert plan(step) == [("a", 0, 0, 16, False), ("b", 1, 0, 16, False)]
    advance(step)
    c = req("c", 5)  # a short prompt arrives: steps stay regular until its first token
    s.add(c)
    step = s.schedule()
    assert plan(step) == [("a", 0, 16, 2, False), ("b", 1, 16, 2, False), ("c", 2, 0, 2, False)]
    advance(step)
    step = s.schedule()  # b has 2 left, c 3: both fit a regular step's shares
    assert plan(step) == [("a", 0, 18, 3, False), ("b", 1, 18, 2, True), ("c", 2, 2, 3, True)]
    advance(step)
    step = s.schedule()  # b and c decode now: the step budget again
    assert plan(step) == [("a", 0, 21, 6, False), ("b", 1, 20, 1, True), ("c", 2, 5, 1, True)]


def test_short_prompts_that_came_together_finish_in_one_step_of_the_prefill_budget():
    s = Scheduler(SlotTable(4, 1000, lambda slot: None), max_batch_tokens=8, max_prefill_tokens=32)
    for name in "abc":
        s.add(req(name, 10))  # each within a regular step, not all three
    step = s.schedule()
    assert plan(step) == [(name, i, 0, 10, True) for i, name in enumerate("abc")]
    advance(step)
    s.add(req("d", 10))  # beside decode tokens: a regular step, fairly shared
    assert plan(s.schedule()) == [
        ("a", 0, 10, 1, True),
        ("b", 1, 10, 1, True),
        ("c", 2, 10, 1, True),
        ("d", 3, 0, 5, False),
    ]


def test_follow_ups_beside_decode_tokens_finish_in_one_step_when_each_is_within_a_regular_one():
    s = Scheduler(SlotTable(5, 1000, lambda slot: None), max_batch_tokens=8, max_prefill_tokens=32)
    for name in "ab":
        s.add(req(name, 4))
    advance(s.schedule())  # a and b decode from now on
    for name in "cd":
        s.add(req(name, 7))  # each within a regular step, not both beside the decode tokens
    assert plan(s.schedule()) == [
        ("a", 0, 4, 1, True),
        ("b", 1, 4, 1, True),
        ("c", 2, 0, 7, True),
        ("d", 3, 0, 7, True),
    ]


@pytest.mark.parametrize(
    ("prompts", "chunks"),
    [
        ((7, 9), (3, 3)),  # one longer than a regular step: the decoders never wait on its chunk
        ((7, 7, 7, 7), None),  # (with a slot more) more than the prefill budget finishes: regular
    ],
)
def test_beside_decode_tokens_a_step_stays_regular_unless_it_finishes_short_prompts(
    prompts, chunks
):
    s = Scheduler(SlotTable(7, 1000, lambda slot: None), max_batch_tokens=8, max_prefill_tokens=24)
    for name in "ab":
        s.add(req(name, 4))
    advance(s.schedule())
    for i, n in enumerate(prompts):
        s.add(req(f"p{i}", n))
    step = plan(s.schedule())
    assert step[:2] == [("a", 0, 4, 1, True), ("b", 1, 4, 1, True)]
    assert sum(n for _, _, _, n, _ in step) <= 8
    if chunks is not None:
        assert tuple(n for _, _, _, n, _ in step[2:]) == chunks


def test_the_prefill_budget_is_never_below_the_step_budget():
    s = Scheduler(SlotTable(2, 1000, lambda slot: None), max_batch_tokens=8, max_prefill_tokens=4)
    s.add(req("a", 100))
    assert sum(len(c.tokens) for c in s.schedule()) == 8


@pytest.mark.parametrize(
    ("n_prompt", "max_prefill", "chunk"),
    [
        (532, 2048, 532),  # 23 left past the 509 the decode tokens leave: taken now
        (600, 2048, 509),  # 91 left, over 509 // 8: the next step's
        (532, 512, 509),  # the batch holds no more than the step budget
    ],
)
def test_a_prompt_takes_a_short_tail_over_the_step_budget_where_the_batch_has_room(
    n_prompt, max_prefill, chunk
):
    s = Scheduler(
        SlotTable(4, 10000, lambda slot: None), max_batch_tokens=512, max_prefill_tokens=max_prefill
    )
    for name in "abc":
        s.add(req(name, 10, max_len=10000))
    advance(s.schedule())  # a, b and c decode from now on
    s.add(req("f", n_prompt, max_len=10000))
    step = plan(s.schedule())
    assert step[:3] == [(name, i, 10, 1, True) for i, name in enumerate("abc")]
    assert step[3] == ("f", 3, 0, chunk, chunk == n_prompt)
    assert sum(n for _, _, _, n, _ in step) <= max_prefill
