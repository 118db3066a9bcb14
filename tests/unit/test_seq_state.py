"""pyqsa_seq_state_save / _load (native/src/pyqsa-seq-state.cpp) on the demo model's contexts,
unpaged and paged (a hot cache of 8 blocks): a sequence loaded into another slot continues bit
for bit as the saved one, through prefill chunks and decode steps, with a prefix ending inside a
block (103 = 25 blocks + 3); the slot it lands in held another sequence's hot cache before.
Bytes that are no state are refused and leave the sequence empty."""

from __future__ import annotations

import ctypes

import llama_cpp as L
import numpy as np
import pytest

from pyqsa import native
from pyqsa.engine.context import ContextConfig, open_context

N_BATCH = 64
RNG = np.random.default_rng(3)
PREFIX = [int(t) for t in RNG.integers(100, 5000, 103)]
OTHER = [int(t) for t in RNG.integers(100, 5000, 90)]
NEXT = [int(t) for t in RNG.integers(100, 5000, 9)]


class Context:
    def __init__(self, model, hot_blocks: int) -> None:
        cfg = ContextConfig(
            n_seqs=2, ctx_per_seq=512, n_batch=N_BATCH, n_threads=2, hot_blocks=hot_blocks
        )
        self.ctx = open_context(model.ptr, cfg)
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = model.n_vocab
        self.batch = L.llama_batch_init(N_BATCH, 0, 1)

    def feed(self, seq: int, start: int, tokens: list[int]) -> np.ndarray:
        """Decode tokens at positions start.. of seq in one ubatch; the last row's logits."""
        b = self.batch
        for j, t in enumerate(tokens):
            b.token[j], b.pos[j], b.n_seq_id[j] = t, start + j, 1
            b.seq_id[j][0], b.logits[j] = seq, j == len(tokens) - 1
        b.n_tokens = len(tokens)
        assert L.llama_decode(self.ctx, b) == 0, native.take_error()
        p = ctypes.cast(
            L.llama_get_logits_ith(self.ctx, len(tokens) - 1), ctypes.POINTER(ctypes.c_float)
        )
        return np.ctypeslib.as_array(p, (self.n_vocab,)).copy()

    def prefill(self, seq: int, tokens: list[int]) -> None:
        for i in range(0, len(tokens), N_BATCH):
            self.feed(seq, i, tokens[i : i + N_BATCH])

    def continue_(self, seq: int) -> list[np.ndarray]:
        """NEXT after PREFIX: one token a step (decode, with paging resolved through the hot
        cache from the first), then a chunk of 4."""
        n = len(PREFIX)
        out = [self.feed(seq, n + i, [t]) for i, t in enumerate(NEXT[:5])]
        return out + [self.feed(seq, n + 5, NEXT[5:])]

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)


@pytest.fixture(params=[0, 8], ids=["unpaged", "paged"])
def context(request, demo_llama):
    c = Context(demo_llama[1], request.param)
    yield c
    c.close()


def test_a_loaded_sequence_continues_bit_for_bit(context):
    c = context
    c.prefill(0, PREFIX)
    state = native.seq_state_save(c.ctx, 0)
    want = c.continue_(0)
    # slot 1 decodes another sequence (its hot cache fills with that one's blocks), is emptied
    c.prefill(1, OTHER)
    for i in range(6):
        c.feed(1, len(OTHER) + i, [7 + i])
    L.llama_memory_seq_rm(c.mem, 1, -1, -1)
    native.seq_state_load(c.ctx, 1, state)
    assert L.llama_memory_seq_pos_max(c.mem, 1) == len(PREFIX) - 1
    got = c.continue_(1)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def test_bytes_that_are_no_state_are_refused(context):
    c = context
    c.prefill(0, PREFIX)
    state = native.seq_state_save(c.ctx, 0)
    for bad in (state[:-5], b"\0" * 64, bytes(state[:24]) + b"\1" * (len(state) - 24)):
        c.prefill(1, OTHER)
        with pytest.raises(native.NativeError, match="pyqsa_seq_state_load"):
            native.seq_state_load(c.ctx, 1, bad)
        assert L.llama_memory_seq_pos_max(c.mem, 1) == -1  # left empty
    with pytest.raises(native.NativeError, match="pyqsa_seq_state_save"):
        native.seq_state_save(c.ctx, 2)  # no such sequence
