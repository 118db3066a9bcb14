"""The native host sampler (pyqsa_sample, the CPU kernel of the sample op that runs where the
logits are) against the numpy reference (pyqsa/engine/sampler.py): the same tokens for the
same seed and counter under every cut, and the same log-probabilities. The CUDA kernel is
checked against this CPU kernel by test-sample (tests/gpu)."""

import numpy as np
import pytest

from pyqsa import native
from pyqsa.engine import SamplingParams
from pyqsa.engine import sampler as engine_sampler
from pyqsa.engine.sampler import ReferenceSampler, Sampler, draw, draw_key, logprobs

SETTINGS = [
    {"temperature": 0},
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 40},
    {"temperature": 0.9, "top_p": 0.9},
    {"temperature": 0.8, "min_p": 0.05},
    {"temperature": 1.2, "top_k": 200, "top_p": 0.95},
    {"temperature": 1.0, "top_k": 50, "top_p": 0.9, "min_p": 0.02},
    {"temperature": 0.3, "top_k": 1},
    {"temperature": 1.0, "top_k": 2**63},  # past int32 and any vocabulary: no cut
]


def rows():
    """Peaked rows (a trained model's), flat ones (the demo model's), and rows of six levels
    (exact ties at every cut), float32 as the runner returns them."""
    gen = np.random.default_rng(11)
    yield "peaked", (gen.standard_normal(32000) * 3).astype(np.float32)
    yield "flat", gen.uniform(-1, 1, 32000).astype(np.float32)
    yield "levels", gen.integers(0, 6, 32000).astype(np.float32)
    yield "tiny", np.array([0.5, 2.0, 2.0, -1.0], np.float32)


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_native_draws_equal_the_reference(kw):
    params = SamplingParams(**kw)
    for _, x in rows():
        for seed, counter in [(0, 0), (1, 5), (2**63 + 12345, 77), (-3, 2**31)]:
            want = draw(x, params, draw_key(seed, counter))
            got = native.sample(x, seed=seed, counter=counter, **kw)
            assert got.token == want, (seed, counter)


@pytest.mark.parametrize("n_top", [0, 1, 5, 20])
def test_native_logprobs_equal_the_reference(n_top):
    for _, x in rows():
        got = native.sample(x, temperature=0.8, seed=4, n_top=n_top)
        want = logprobs(x, got.token, n_top)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-5)
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
        assert [lp for _, lp in got.top] == pytest.approx([lp for _, lp in want.top], abs=1e-5)


def test_no_logprobs_asked_gives_nan():
    got = native.sample(np.zeros(10, np.float32), temperature=1.0)
    assert np.isnan(got.logprob) and got.top == ()


def test_bad_arguments_are_refused():
    ffi, lib = native.raw()
    p = ffi.new("pyqsa_sample_params *")
    out = ffi.new("pyqsa_sample_result *")
    x = ffi.new("float[]", 4)
    adjust = ffi.new("pyqsa_logit_adjust[]", 2)
    assert lib.pyqsa_sample(x, 4, p, adjust, 2, out) == 0
    assert lib.pyqsa_sample(ffi.NULL, 4, p, ffi.NULL, 0, out) == -1
    assert lib.pyqsa_sample(x, 0, p, ffi.NULL, 0, out) == -1
    assert lib.pyqsa_sample(x, 4, p, adjust, -1, out) == -1
    assert lib.pyqsa_sample(x, 4, p, ffi.NULL, 2, out) == -1
    p.n_top = 21
    assert lib.pyqsa_sample(x, 4, p, ffi.NULL, 0, out) == -1


PENALTIES = [
    {"logit_bias": {5: 4.0, 17: -3.0, 31999: 10.0}},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.8, "frequency_penalty": 0.5, "presence_penalty": 0.25},
    {"frequency_penalty": -0.7, "presence_penalty": 1.5, "logit_bias": {3: 2.5}},
]


@pytest.mark.parametrize("pen", PENALTIES, ids=lambda kw: ",".join(kw))
@pytest.mark.parametrize("kw", [SETTINGS[0], SETTINGS[1], SETTINGS[5]], ids=["greedy", "t1", "cut"])
def test_native_penalized_draws_equal_the_reference(pen, kw):
    """The engine's sampler (bias and penalties as a list of logit adjustments, the native
    kernel) against the reference (numpy apply_penalties, then the numpy draw), draw after
    draw as the output grows; the penalties move the tokens (the rows' best ids are in the
    prompt and output)."""
    gen = np.random.default_rng(5)
    moved = 0
    for name, x in rows():
        if x.size < 32000:
            continue
        best = np.argsort(-x, kind="stable")[:8].tolist()
        prompt = gen.integers(0, 32000, 300).tolist() + best[:4]
        params = SamplingParams(**kw, **pen, seed=9, logprobs=3)
        plain = ReferenceSampler(SamplingParams(**kw, seed=9), 0)
        ref, nat = ReferenceSampler(params, 0), Sampler(params, 0)
        tokens = prompt + best[4:] * 3
        for step in range(6):
            want, want_lp = ref(x, tokens, len(prompt))
            got, got_lp = nat(x, tokens, len(prompt))
            assert got == want, (name, step)
            assert got_lp.logprob == pytest.approx(want_lp.logprob, abs=1e-5)
            assert [t for t, _ in got_lp.top] == [t for t, _ in want_lp.top]
            moved += got != plain(x, tokens, len(prompt))[0]
            tokens.append(got)
    assert moved > 0


@pytest.mark.parametrize("pen", PENALTIES, ids=lambda kw: ",".join(kw))
@pytest.mark.parametrize("every", [1, 3])
def test_adjustment_rows_kept_across_draws_equal_the_reference(pen, every):
    """Sampler.adjustments folds only the tokens output since its last call into the rows it
    keeps: applied to a logits row (as pyqsa_logit_adjust, float32), they give the reference's
    apply_penalties bit for bit at every length, called after every draw or every third; ids
    ascending and distinct."""
    gen = np.random.default_rng(11)
    n_vocab = 32000
    prompt = gen.integers(0, 400, 200).tolist()
    sampler = Sampler(SamplingParams(**pen), 0)
    tokens = list(prompt)
    for step in range(90):
        tokens.append(int(gen.integers(0, 600)))  # repeats, prompt ids and new ones
        if step % every:
            continue
        rows = sampler.adjustments(n_vocab, tokens, len(prompt))
        ids = rows[:, 0]
        assert (np.diff(ids) > 0).all()
        x = gen.standard_normal(n_vocab).astype(np.float32)
        got = x.copy()
        bias, rep, sub = rows[:, 1:].view(np.float32).T
        y = got[ids] + bias
        y = np.where(rep != 1.0, np.where(y > 0, y / rep, y * rep), y)
        got[ids] = y - sub
        want = engine_sampler.apply_penalties(x, sampler.params, tokens, len(prompt))
        assert np.array_equal(got, want), step


def test_device_sampler_refuses_bad_capacities_and_lists():
    for bad in (-1, 65537):
        with pytest.raises(native.NativeError, match="max_adjust"):
            native.DeviceSampler(bad)
    sampler = native.DeviceSampler(2)
    try:
        row = [5, 0, int(np.float32(1.0).view(np.int32)), 0]
        sampler.set(temperature=0.0, adjust=np.array([row, row], np.int32))
        with pytest.raises(native.NativeError):  # 3 adjustments, room for 2
            sampler.set(temperature=0.0, adjust=np.array([row] * 3, np.int32))
        with pytest.raises(ValueError, match="rows of 4 words"):
            sampler.set(temperature=0.0, adjust=np.array([1, 2, 3], np.int32))
    finally:
        sampler.free()
    with pytest.raises(ValueError, match="rows of 4 words"):
        native.sample(np.zeros(8, np.float32), temperature=0.0, adjust=np.zeros((2, 3), np.int32))
