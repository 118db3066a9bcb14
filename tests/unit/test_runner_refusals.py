"""Batches the runner refuses without harm: one that breaks the QSA positional path's invariant
(cell index == position) fails its step with an error instead of aborting the process, and one
larger than the step budget is refused before anything is written."""

from __future__ import annotations

import pytest

from pyqsa.engine import EngineConfig, SamplingParams
from pyqsa.engine.request import Request
from pyqsa.engine.runner import LlamaModel, LlamaRunner, RunnerError
from pyqsa.engine.scheduler import Chunk
from pyqsa.engine.slots import SlotLease

PROMPT = [(5 * i + 7) % 5000 + 100 for i in range(24)]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from pyqsa.demo_model import demo_model_path

    path = str(demo_model_path(tmp_path_factory.mktemp("demo")))
    model = LlamaModel(path)
    cfg = EngineConfig(path, n_slots=2, ctx_per_slot=256, max_batch_tokens=64, n_threads=1)
    r = LlamaRunner(model, cfg)
    yield r
    r.close()
    model.close()


def chunk(slot: int, start: int, tokens: list[int]) -> Chunk:
    req = Request("r", list(tokens), SamplingParams(temperature=0), lambda ev: None, 256)
    return Chunk(req, SlotLease(slot, 0, 256), start, tuple(tokens))


def test_a_sequence_not_started_at_zero_is_an_error_not_an_abort(runner):
    expected = runner.run([chunk(0, 0, PROMPT)])[0]
    runner.release(0)
    with pytest.raises(RunnerError, match="cell index == position"):
        runner.run([chunk(1, 5, PROMPT)])  # slot 1 is empty: its first cell would hold position 5
    runner.release(1)
    # the process is alive and both slots give the same answer as before
    for slot in (0, 1):
        assert (runner.run([chunk(slot, 0, PROMPT)])[0] == expected).all()
        runner.release(slot)


def test_an_oversized_batch_is_refused_before_it_is_written(runner):
    expected = runner.run([chunk(0, 0, PROMPT)])[0]
    runner.release(0)
    with pytest.raises(RunnerError, match="exceeds 64"):
        runner.run([chunk(0, 0, PROMPT * 3)])  # 72 tokens
    assert (runner.run([chunk(0, 0, PROMPT)])[0] == expected).all()
    runner.release(0)


def test_a_prefill_step_may_use_the_prefill_budget(tmp_path_factory):
    """With max_prefill_tokens the runner takes a step that large (a step with no decode in it)."""
    from pyqsa.demo_model import demo_model_path

    path = str(demo_model_path(tmp_path_factory.mktemp("demo")))
    model = LlamaModel(path)
    cfg = EngineConfig(
        path, n_slots=2, ctx_per_slot=256, max_batch_tokens=16, max_prefill_tokens=96, n_threads=1
    )
    r = LlamaRunner(model, cfg)
    try:
        assert r.run([chunk(0, 0, PROMPT * 3)])[0].shape == (model.n_vocab,)  # 72 tokens
        with pytest.raises(RunnerError, match="exceeds 96"):
            r.run([chunk(1, 0, PROMPT * 5)])  # 120 tokens
    finally:
        r.close()
        model.close()
