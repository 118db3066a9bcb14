"""bench/prefill_sim.py's split_equal, which the scheduler's chunk shapes are designed around,
against llama.cpp itself: the ubatches one llama_decode really runs with one KV stream per
sequence (the runner's context), read from a tensor computed once per ubatch."""

from __future__ import annotations

import sys
from pathlib import Path

import llama_cpp as L
import pytest

from pyqsa.debug import TensorCapture
from pyqsa.engine.context import ContextConfig, open_context
from pyqsa.engine.runner import LlamaModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from prefill_sim import split_equal  # noqa: E402

N_BATCH = 256
BATCHES = [  # (seq_id, tokens) chunks in batch order
    [(0, 1), (1, 1), (2, 1), (3, 1)],  # decode: one ubatch
    [(0, 1), (1, 20), (2, 20), (3, 20)],  # a decode token's pass, then equal chunks
    [(0, 1), (1, 20), (2, 1), (3, 20)],  # seqs 1 and 3 are not consecutive: two more
    [(2, 5), (0, 1), (1, 3)],  # out of seq order
    [(0, 30), (1, 5), (2, 30)],  # unequal chunks
    [(s, 30) for s in range(7)],  # equal chunks: one ubatch
]


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    """llama_decode(batch) -> the token count of each ubatch it ran."""
    from pyqsa.demo_model import demo_model_path

    model = LlamaModel(str(demo_model_path(tmp_path_factory.mktemp("demo"))))
    ubatches: list[int] = []
    cap = TensorCapture("ffn_moe_logits-0", lambda name, a: ubatches.append(a.shape[-2]))
    # the runner's context settings: one KV stream per sequence
    cfg = ContextConfig(n_seqs=8, ctx_per_seq=512, n_batch=N_BATCH, n_threads=1)
    ctx = open_context(model.ptr, cfg, cb_eval=cap.callback)
    batch = L.llama_batch_init(N_BATCH, 0, 1)
    pos = [0] * 8

    def run(chunks: list[tuple[int, int]]) -> list[int]:
        i = 0
        for seq, n in chunks:
            for j in range(n):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = 1000 + j, pos[seq] + j, 1
                batch.seq_id[i][0], batch.logits[i] = seq, j == n - 1
                i += 1
            pos[seq] += n
        batch.n_tokens = i
        ubatches.clear()
        assert L.llama_decode(ctx, batch) == 0
        cap.raise_pending()
        return list(ubatches)

    yield run
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    model.close()


@pytest.mark.parametrize("chunks", BATCHES)
def test_split_equal_mirrors_llama_decode(decode, chunks):
    assert decode(chunks) == [sum(n for _, n in u) for u in split_equal(chunks, N_BATCH)]
