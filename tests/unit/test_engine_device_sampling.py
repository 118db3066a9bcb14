"""The engine's draws against the numpy reference on the demo model (CPU): inside the forward
pass (EngineConfig.sample_on_device: the sample op after the logits, through llama.cpp's
backend sampling) and on the host (the op's host kernel on each logits row). The same tokens
for greedy and seeded requests under every cut, with logit bias and penalties (the draw's list
of adjusted tokens), log-probabilities within float32 rounding, with a request whose list is
too long for the device drawn on the host in the same batches. The CUDA kernel of the op is
checked against the CPU kernel by test-sample."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import Collector

import pyqsa.engine.engine
import pyqsa.engine.runner
from pyqsa import native
from pyqsa.engine import Engine, EngineConfig, SamplingParams
from pyqsa.engine.runner import DEVICE_MAX_ADJUST, LlamaModel, LlamaRunner
from pyqsa.engine.sampler import ReferenceSampler

PARAMS = [
    SamplingParams(temperature=0, max_tokens=12),
    SamplingParams(temperature=1.0, seed=1, max_tokens=12),
    SamplingParams(temperature=0.8, top_k=20, seed=2, max_tokens=12, logprobs=3),
    SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=12),
    SamplingParams(temperature=1.1, min_p=0.05, top_k=50, top_p=0.95, seed=4, max_tokens=12),
    SamplingParams(temperature=0, max_tokens=12, logprobs=0),
    SamplingParams(temperature=0.7, seed=5, max_tokens=12, repetition_penalty=1.3),
    SamplingParams(temperature=0, max_tokens=12, logit_bias={7: 5.0}),
    SamplingParams(
        temperature=0.9,
        top_k=40,
        seed=6,
        max_tokens=12,
        logprobs=2,
        repetition_penalty=0.9,
        frequency_penalty=0.6,
        presence_penalty=0.4,
        logit_bias={11: 3.0, 400: -2.0},
    ),
    SamplingParams(temperature=0, max_tokens=12, frequency_penalty=1.5),
    # more adjusted tokens than a device draw takes: drawn on the host
    SamplingParams(
        temperature=0, max_tokens=12, logit_bias={i: 0.5 for i in range(DEVICE_MAX_ADJUST + 1)}
    ),
]
PROMPTS = [[(13 * i + 7 * k) % 3000 + 50 for i in range(20 + 9 * k)] for k in range(len(PARAMS))]


def generate(path: str, model: LlamaModel, on_device: bool, n_slots: int, hot_blocks: int):
    """Every request's tokens and logprobs from one engine run."""
    config = EngineConfig(
        path,
        n_slots=n_slots,
        ctx_per_slot=256,
        max_batch_tokens=64,
        n_threads=1,
        hot_blocks=hot_blocks,
        sample_on_device=on_device,
    )
    runner = LlamaRunner(model, config)
    engine = Engine(config, runner, model).start()
    try:
        sinks = [Collector() for _ in PARAMS]
        for prompt, params, sink in zip(PROMPTS, PARAMS, sinks, strict=True):
            engine.submit(prompt, params, sink)
        for sink in sinks:
            sink.wait(timeout=120)
        logprobs = [
            [lp for e in s.seen if hasattr(e, "logprobs") for lp in e.logprobs] for s in sinks
        ]
        return [s.tokens for s in sinks], logprobs
    finally:
        engine.stop()
        runner.close()


# all at once; through slots freed and reused; and with the QSA K/V paged (8 hot blocks)
@pytest.mark.parametrize("n_slots,hot_blocks", [(8, 0), (3, 0), (3, 8)])
def test_draws_equal_the_reference(demo_llama, monkeypatch, n_slots, hot_blocks):
    path, model = demo_llama
    with monkeypatch.context() as m:
        m.setattr(pyqsa.engine.engine, "Sampler", ReferenceSampler)
        want_tokens, want_lps = generate(path, model, False, n_slots, hot_blocks)
    assert all(len(t) == 12 for t in want_tokens)
    adjusted = []  # the adjusted-token counts of the draws set on device samplers
    set_draw = native.DeviceSampler.set

    def spy(self, adjust=None, **draw):
        adjusted.append(0 if adjust is None else len(adjust))
        set_draw(self, adjust=adjust, **draw)

    monkeypatch.setattr(native.DeviceSampler, "set", spy)
    for on_device in (False, True):
        got_tokens, got_lps = generate(path, model, on_device, n_slots, hot_blocks)
        assert got_tokens == want_tokens, on_device
        for got, want in zip(got_lps, want_lps, strict=True):
            assert [lp.token for lp in got] == [lp.token for lp in want]
            assert np.allclose([lp.logprob for lp in got], [lp.logprob for lp in want], atol=1e-5)
            assert [[t for t, _ in lp.top] for lp in got] == [[t for t, _ in lp.top] for lp in want]
    # biased and penalized draws ran on the device; the over-long list never did
    assert max(adjusted) > 0 and max(adjusted) <= DEVICE_MAX_ADJUST


def test_only_host_requests_come_back_as_logits(demo_llama):
    """A runner with device sampling returns draws for the rows it drew and logits rows for
    the others, in chunk order."""
    from pyqsa import native
    from pyqsa.engine.request import Request
    from pyqsa.engine.scheduler import Chunk
    from pyqsa.engine.slots import SlotLease

    path, model = demo_llama
    config = EngineConfig(
        path, n_slots=2, ctx_per_slot=64, max_batch_tokens=64, n_threads=1, sample_on_device=True
    )
    runner = LlamaRunner(model, config)
    try:
        reqs = [Request(f"r{i}", PROMPTS[i][:10], PARAMS[0], lambda ev: None, 64) for i in (0, 1)]
        chunks = [Chunk(r, SlotLease(i, 0, 64), 0, tuple(r.tokens)) for i, r in enumerate(reqs)]
        draw = {"temperature": 0.0, "n_top": 2}
        rows = runner.run(chunks, [draw, None])
        assert isinstance(rows[0], native.SampleResult) and isinstance(rows[1], np.ndarray)
        assert len(rows[0].top) == 2 and rows[1].shape == (model.n_vocab,)
    finally:
        runner.close()


def test_a_slot_switches_between_device_and_host_draws(demo_llama):
    """One sequence drawn on the device, then on the host, then on the device with and without
    logit adjustments: each switch attaches a new sampler (llama.cpp aborts when a sampler
    chain it initialized is attached again)."""
    from pyqsa.engine.request import Request
    from pyqsa.engine.scheduler import Chunk
    from pyqsa.engine.slots import SlotLease

    path, model = demo_llama
    config = EngineConfig(
        path, n_slots=1, ctx_per_slot=64, max_batch_tokens=64, n_threads=1, sample_on_device=True
    )
    runner = LlamaRunner(model, config)
    try:
        req = Request("r", PROMPTS[0][:10], PARAMS[0], lambda ev: None, 64)
        lease = SlotLease(0, 0, 64)
        plain = {"temperature": 0.0, "n_top": 1}
        biased = {**plain, "adjust": np.array([[5, np.float32(50.0).view(np.int32), 0, 0]])}
        biased["adjust"][:, 2] = np.float32(1.0).view(np.int32)
        pos, token = 0, tuple(req.tokens)
        for draw in (plain, None, plain, biased, None, biased, plain):
            (out,) = runner.run([Chunk(req, lease, pos, token)], [draw])
            pos += len(token)
            if draw is None:
                assert isinstance(out, np.ndarray)
                token = (int(np.argmax(out)),)
            else:
                assert isinstance(out, native.SampleResult)
                assert draw is plain or out.token == 5  # a bias of +50 picks token 5
                token = (out.token,)
            req.tokens.append(token[0])
    finally:
        runner.close()


def decode_steps(path: str, model: LlamaModel, params: list[SamplingParams], steps: int):
    """Each request (one a slot) prefilled, then decoded `steps` tokens with its draws made on
    the device, as the engine makes them; (each request's tokens, the slot of each sampler set)."""
    from pyqsa.engine.request import Request
    from pyqsa.engine.scheduler import Chunk
    from pyqsa.engine.slots import SlotLease

    n = len(params)
    config = EngineConfig(
        path, n_slots=n, ctx_per_slot=64, max_batch_tokens=64, n_threads=1, sample_on_device=True
    )
    runner = LlamaRunner(model, config)
    slot_of = {id(s): i for i, s in enumerate(runner._attached)}
    sets: list[int] = []
    set_draw = native.DeviceSampler.set

    def spy(self, adjust=None, **draw):
        sets.append(slot_of[id(self)])
        set_draw(self, adjust=adjust, **draw)

    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(native.DeviceSampler, "set", spy)
            reqs = [
                Request(f"r{i}", PROMPTS[i][:10], params[i], lambda ev: None, 64) for i in range(n)
            ]
            samplers = [ReferenceSampler(p, 3) for p in params]
            leases = [SlotLease(i, 0, 64) for i in range(n)]
            chunks = [
                Chunk(r, lease, 0, tuple(r.tokens)) for r, lease in zip(reqs, leases, strict=True)
            ]
            for _ in range(steps):
                draws = [
                    s.device_draw(model.n_vocab, r.tokens, len(r.prompt), DEVICE_MAX_ADJUST)
                    for s, r in zip(samplers, reqs, strict=True)
                ]
                for s, r, row in zip(samplers, reqs, runner.run(chunks, draws), strict=True):
                    r.tokens.append(s.take(row)[0])
                chunks = [
                    Chunk(r, lease, len(r.tokens) - 1, tuple(r.tokens[-1:]))
                    for r, lease in zip(reqs, leases, strict=True)
                ]
    finally:
        runner.close()
    return [r.tokens[len(r.prompt) :] for r in reqs], sets


def test_greedy_draws_set_a_slot_sampler_once(demo_llama, monkeypatch):
    """A device sampler keeps the draw set on it: a greedy request's draws (which read neither
    seed nor counter) are set once, not before every pass; seeded draws (the counter moves) and
    draws with logit adjustments are set each time. The tokens are those of a sampler set
    before every pass."""
    path, model = demo_llama
    params = [
        SamplingParams(temperature=0, logprobs=1),
        SamplingParams(temperature=1.0, seed=7),
        SamplingParams(temperature=0, logit_bias={11: 2.0}),
        SamplingParams(temperature=0),
    ]
    steps = 5
    tokens, sets = decode_steps(path, model, params, steps)
    assert [sets.count(slot) for slot in range(len(params))] == [1, steps, steps, 1]
    monkeypatch.setattr(pyqsa.engine.runner, "draw_key", lambda draw: None)  # set every time
    every_time, sets = decode_steps(path, model, params, steps)
    assert [sets.count(slot) for slot in range(len(params))] == [steps] * len(params)
    assert tokens == every_time
