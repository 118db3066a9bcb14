"""The native host sampler (pyqsa_sample, the CPU kernel of the sample op that runs where the
logits are) against the numpy reference (pyqsa/engine/sampler.py): the same tokens for the
same seed and counter under every cut, and the same log-probabilities. The CUDA kernel is
checked against this CPU kernel by test-sample (tests/gpu)."""

import numpy as np
import pytest

from pyqsa import native
from pyqsa.engine import SamplingParams
from pyqsa.engine.sampler import draw, draw_key, logprobs

SETTINGS = [
    {"temperature": 0},
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 40},
    {"temperature": 0.9, "top_p": 0.9},
    {"temperature": 0.8, "min_p": 0.05},
    {"temperature": 1.2, "top_k": 200, "top_p": 0.95},
    {"temperature": 1.0, "top_k": 50, "top_p": 0.9, "min_p": 0.02},
    {"temperature": 0.3, "top_k": 1},
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
    assert lib.pyqsa_sample(ffi.NULL, 4, p, out) == -1
    assert lib.pyqsa_sample(x, 0, p, out) == -1
    p.n_top = 21
    assert lib.pyqsa_sample(x, 4, p, out) == -1
