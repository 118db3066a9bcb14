import numpy as np
import pytest

from pyqsa.engine import SamplingParams
from pyqsa.engine.sampler import Sampler, apply_penalties, draw, logprobs


def test_greedy_is_argmax_with_lowest_id_on_ties():
    x = np.array([0.0, 3.0, 1.0, 3.0], np.float32)
    assert draw(x, SamplingParams(temperature=0), np.random.default_rng(0)) == 1


def test_seeded_requests_repeat_and_differ_by_seed():
    rng = np.random.default_rng(1)
    x = rng.normal(size=1000).astype(np.float32)

    def run(seed):
        s = Sampler(SamplingParams(temperature=1.0, seed=seed), seed=999)
        return [s(x, [], 0)[0] for _ in range(20)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_top_k_top_p_min_p_restrict_the_candidates():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float64)).astype(np.float32)
    rng = np.random.default_rng(0)

    def support(**kw):
        p = SamplingParams(temperature=1.0, **kw)
        return {draw(x, p, rng) for _ in range(400)}

    assert support() == {0, 1, 2, 3}
    assert support(top_k=2) == {0, 1}
    assert support(top_p=0.79) == {0, 1}  # 0.5 + 0.3 reaches 0.79
    assert support(top_p=0.5) == {0}
    assert support(min_p=0.35) == {0, 1}  # 0.15 < 0.35 * 0.5


def test_sampling_follows_the_distribution():
    p = np.array([0.6, 0.3, 0.1])
    x = np.log(p).astype(np.float32)
    s = Sampler(SamplingParams(temperature=1.0, seed=3), seed=0)
    counts = np.bincount([s(x, [], 0)[0] for _ in range(3000)], minlength=3) / 3000
    assert np.allclose(counts, p, atol=0.03)


def test_penalties_and_bias_exact_values():
    x = np.array([1.0, 2.0, -1.0, 0.5, 0.0], np.float32)
    params = SamplingParams(
        repetition_penalty=2.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias={4: 3.0},
    )
    # prompt [0, 2]; output [1, 1, 3]
    y = apply_penalties(x, params, [0, 2, 1, 1, 3], n_prompt=2)
    expected = [
        1.0 / 2,  # prompt token, positive: divided
        2.0 / 2 - 0.5 - 0.25 * 2,  # output twice
        -1.0 * 2,  # prompt token, negative: multiplied
        0.5 / 2 - 0.5 - 0.25,
        3.0,  # bias only
    ]
    assert y.tolist() == pytest.approx(expected)
    assert x.tolist() == [1.0, 2.0, -1.0, 0.5, 0.0]  # input untouched


def test_logprobs_are_normalised_and_ranked():
    x = np.array([2.0, 1.0, 0.0], np.float32)
    lp = logprobs(x, token=1, n_top=2)
    x64 = x.astype(np.float64)
    full = x64 - np.log(np.exp(x64).sum())  # float32 exp/log differ by a few ULPs across builds
    assert lp.logprob == pytest.approx(full[1], rel=1e-5)
    assert [t for t, _ in lp.top] == [0, 1]
    assert lp.top[0][1] == pytest.approx(full[0], rel=1e-5)


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": -1},
        {"max_tokens": 0},
        {"repetition_penalty": 0},
        {"stop": ("",)},
        {"logprobs": 21},
    ],
)
def test_bad_params_are_refused(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
