from pyqsa.engine import SamplingParams
from pyqsa.engine.request import Request, RequestState
from pyqsa.engine.scheduler import Scheduler
from pyqsa.engine.slots import SlotTable


def req(rid: str, n_prompt: int) -> Request:
    return Request(rid, list(range(1, n_prompt + 1)), SamplingParams(), lambda ev: None, 100)


def plan(chunks):
    return [(c.request.request_id, c.lease.slot, c.start, len(c.tokens), c.sample) for c in chunks]


def advance(chunks, new_token: int = 7):
    """What the engine does after a step: mark computed, append a token where sampled."""
    for c in chunks:
        c.request.num_computed_tokens += len(c.tokens)
        if c.sample:
            c.request.tokens.append(new_token)


def test_decode_first_then_prompt_chunks_within_budget():
    released: list[int] = []
    s = Scheduler(SlotTable(3, 100, released.append), max_batch_tokens=8)
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
    assert plan(step) == [("a", 0, 4, 1, True), ("b", 1, 12, 7, False)]
    assert c.lease.slot == 2
    advance(step)
    step = s.schedule()
    assert plan(step) == [("a", 0, 5, 1, True), ("b", 1, 19, 1, True), ("c", 2, 0, 2, True)]
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
