"""The scheduler's promise to decoding requests, whatever its prefill policy: every running
request with one pending token gets that token into every step, however old it is and however
large a prompt chunk waits beside it (the budget always holds one token per slot here)."""

import random

import pytest

from pyqsa.engine import SamplingParams
from pyqsa.engine.request import Request
from pyqsa.engine.scheduler import Scheduler
from pyqsa.engine.slots import SlotTable

CTX = 400


def request(rid: str, n_prompt: int, max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    return Request(rid, [1] * n_prompt, params, lambda ev: None, n_prompt + max_tokens)


def run_checking_decode_first(s: Scheduler, arrivals: dict[int, list[Request]]) -> None:
    """Step the scheduler as the engine would, adding requests at their step; check each
    plan."""
    step = 0
    submitted = 0
    while step <= max(arrivals) or s.running or s.waiting:
        for r in arrivals.get(step, []):
            r.arrival = submitted
            submitted += 1
            s.add(r)
        chunks = s.schedule()
        decoding = [r for r in s.running if r.num_pending == 1]
        planned = {c.request.request_id: c for c in chunks}
        for r in decoding:
            c = planned.get(r.request_id)
            assert c is not None, f"step {step}: {r.request_id} is decoding and got no token"
            assert len(c.tokens) == 1 and c.sample
        assert sum(len(c.tokens) for c in chunks) <= s.max_batch_tokens
        for c in chunks:  # what the engine does after the forward pass
            c.request.num_computed_tokens += len(c.tokens)
            if c.sample:
                c.request.tokens.append(7)
                if len(c.request.tokens) >= c.request.max_len:
                    s.finish(c.request)
        step += 1


@pytest.mark.parametrize("decoding", ["young", "middle", "old", "young+old"])
def test_decoders_of_any_age_get_their_token_beside_a_step_filling_prompt(decoding):
    """Three running requests, oldest first; those named in `decoding` have one pending token,
    the others a prompt longer than the whole step."""
    s = Scheduler(SlotTable(3, CTX, lambda slot: None), max_batch_tokens=8)
    reqs = {name: request(name, 100, 5) for name in ("old", "middle", "young")}
    for r in reqs.values():
        s.add(r)
    s.schedule()  # admits all three, in arrival order
    for name in decoding.split("+"):
        r = reqs[name]
        r.num_computed_tokens = len(r.prompt)
        r.tokens.append(7)
    chunks = s.schedule()
    got = {c.request.request_id: (len(c.tokens), c.sample) for c in chunks}
    for name in decoding.split("+"):
        assert got.get(name) == (1, True), (name, got)
    assert sum(len(c.tokens) for c in chunks) <= 8


@pytest.mark.parametrize("long_turns", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_random_arrivals_keep_decode_first(seed, long_turns):
    rng = random.Random(seed)
    s = Scheduler(SlotTable(4, CTX, lambda slot: None), max_batch_tokens=24, long_turns=long_turns)
    arrivals: dict[int, list[Request]] = {}
    for i in range(12):
        r = request(f"r{i}", rng.randint(1, 200), rng.randint(1, 20))
        arrivals.setdefault(rng.randint(0, 40), []).append(r)
    run_checking_decode_first(s, arrivals)
