"""When LlamaRunner.run hands over to its caller (on_launch): on a CPU build before llama_decode,
which computes the pass; where passes are asynchronous (every layer on a GPU) right after it,
while the device runs the pass queued."""

from __future__ import annotations

import llama_cpp
import pytest

from pyqsa.engine import EngineConfig, SamplingParams
from pyqsa.engine.request import Request
from pyqsa.engine.runner import LlamaModel, LlamaRunner
from pyqsa.engine.scheduler import Chunk
from pyqsa.engine.slots import SlotLease

PROMPT = [(7 * i + 3) % 5000 + 100 for i in range(16)]


@pytest.fixture(scope="module")
def runner():
    from pyqsa.demo_model import demo_model_path

    path = str(demo_model_path())
    model = LlamaModel(path)
    r = LlamaRunner(model, EngineConfig(path, n_slots=1, ctx_per_slot=64, max_batch_tokens=32))
    yield r
    r.close()
    model.close()


def calls_around_decode(runner, monkeypatch) -> list[str]:
    calls: list[str] = []
    decode = llama_cpp.llama_decode

    def recorded(ctx, batch):
        calls.append("decode")
        return decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", recorded)
    req = Request("r", PROMPT, SamplingParams(temperature=0), lambda ev: None, 64)
    row = runner.run(
        [Chunk(req, SlotLease(0, 0, 64), 0, tuple(PROMPT))], None, lambda: calls.append("launch")
    )
    runner.release(0)
    assert len(row) == 1 and row[0].shape == (runner.n_vocab,)
    return calls


def test_a_cpu_build_hands_over_before_the_pass(runner, monkeypatch):
    assert not runner.passes_async  # no GPU offload here
    assert calls_around_decode(runner, monkeypatch) == ["launch", "decode"]


def test_asynchronous_passes_hand_over_once_queued(runner, monkeypatch):
    monkeypatch.setattr(runner, "passes_async", True)
    assert calls_around_decode(runner, monkeypatch) == ["decode", "launch"]
