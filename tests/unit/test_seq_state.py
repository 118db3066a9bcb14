"""pyqsa_seq_state_save / _load / _resume (native/src/pyqsa-seq-state.cpp) on the demo model's
contexts, unpaged and paged (a hot cache of 8 blocks): a sequence loaded into another slot from
its head and its rows, cut into segments anywhere, continues bit for bit as the saved one, through
prefill chunks and decode steps, with a prefix ending inside a block (103 = 25 blocks + 3); the
slot it lands in held another sequence's hot cache before. A sequence that went on past the
saved state (further than the ring of newest positions holds) resumes it from the head alone, as
exactly. Bytes that are no state, and segments that do not cover one, are refused and leave the
sequence empty."""

from __future__ import annotations

import ctypes
import threading

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
# 135 positions: the tail block, 132..134, wraps in the paged context's ring of 67 rows (n_ubatch
# + r - 1) between 133 and 134, so its rows are two runs
LONG = [int(t) for t in RNG.integers(100, 5000, 135)]


class Context:
    def __init__(self, model, hot_blocks: int, ctx_per_seq: int = 512) -> None:
        cfg = ContextConfig(
            n_seqs=2, ctx_per_seq=ctx_per_seq, n_batch=N_BATCH, n_threads=2, hot_blocks=hot_blocks
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

    def continue_(self, seq: int, n: int = len(PREFIX)) -> list[np.ndarray]:
        """NEXT after the first n tokens of PREFIX: one token a step (decode, with paging
        resolved through the hot cache from the first), then a chunk of 4."""
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
    head, rows = native.seq_state_save(c.ctx, 0)
    n = len(PREFIX)
    with pytest.raises(native.NativeError):
        rows.size(0, n + 1)  # past the positions saved
    want = c.continue_(0)
    # the rows are copied only after the sequence went on (as the prefix cache's copier does):
    # by many blocks, whose keys the unpaged indexer cache keeps in rows below n
    grow(c, 0, n + len(NEXT))
    # cut inside a block and at one token: each series' rows split at start // r
    cuts = [0, 41, 42, n]
    segments = [(a, b, rows.get(a, b)) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert sum(len(s) for _, _, s in segments) == rows.size(0, n) == len(rows.get(0, n))
    rows.close()
    # slot 1 decodes another sequence (its hot cache fills with that one's blocks), is emptied
    c.prefill(1, OTHER)
    for i in range(6):
        c.feed(1, len(OTHER) + i, [7 + i])
    L.llama_memory_seq_rm(c.mem, 1, -1, -1)
    native.seq_state_load(c.ctx, 1, head, segments)
    assert L.llama_memory_seq_pos_max(c.mem, 1) == len(PREFIX) - 1
    got = c.continue_(1)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def test_rows_opened_ahead_of_a_save_join_its_own(context):
    """The rows of a growing sequence's first positions, through a handle opened before its save
    (pyqsa_seq_rows_open: no head), and the save's rows of the rest make the saved state."""
    c = context
    c.prefill(0, PREFIX[:62])  # inside a block of 4: its key comes with the later segment
    early = native.seq_rows_open(c.ctx, 0)
    with pytest.raises(native.NativeError):
        early.size(0, 63)
    c.feed(0, 62, PREFIX[62:])
    head, rows = native.seq_state_save(c.ctx, 0)
    n = len(PREFIX)
    want = c.continue_(0)
    grow(c, 0, n + len(NEXT))
    segments = [(0, 62, early.get(0, 62)), (62, n, rows.get(62, n))]
    assert len(segments[0][2]) == early.size(0, 62) == rows.size(0, 62)
    assert np.array_equal(segments[0][2], rows.get(0, 62))
    early.close()
    rows.close()
    L.llama_memory_seq_rm(c.mem, 1, -1, -1)
    native.seq_state_load(c.ctx, 1, head, segments)
    got = c.continue_(1)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def grow(c: Context, seq: int, at: int) -> None:
    """On from position `at` by more than the rings hold (n_ubatch + r - 1 positions)."""
    for i in range(0, 2 * N_BATCH, 16):
        c.feed(seq, at + i, OTHER[i % 64 : i % 64 + 16])


@pytest.mark.parametrize("prompt", [PREFIX[:101], LONG], ids=["tail-1", "tail-3-wrapping"])
def test_a_sequence_resumes_a_shorter_state_of_its_own(context, prompt):
    c = context
    n = len(prompt)  # 101 = 25 blocks + 1: the next two steps attend the incomplete tail block
    c.prefill(0, prompt)
    head, rows = native.seq_state_save(c.ctx, 0)
    rows.close()
    want = c.continue_(0, n)
    grow(c, 0, n + len(NEXT))  # the tail block's ring rows now hold later positions
    native.seq_state_resume(c.ctx, 0, head)
    assert L.llama_memory_seq_pos_max(c.mem, 0) == n - 1
    got = c.continue_(0, n)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    # a sequence shorter than the state does not hold it: refused, left empty
    c.prefill(1, OTHER[:50])
    with pytest.raises(native.NativeError, match="pyqsa_seq_state_resume"):
        native.seq_state_resume(c.ctx, 1, head)
    assert L.llama_memory_seq_pos_max(c.mem, 1) == -1


def test_two_states_of_one_sequence_share_their_rows(context):
    """The prefix cache's lineage: a state at n1, its rows copied after the sequence decoded on
    (other block keys in the unpaged indexer's rows past n1 / r), resumed, then computed on to n2
    as a prompt chunk and saved again: n2's state loads from n1's segment and its own, and
    continues as the sequence at n2 does."""
    c = context
    n1, n2 = 80, 103
    c.prefill(0, PREFIX[:n1])
    head1, rows1 = native.seq_state_save(c.ctx, 0)
    for i in range(n2 - n1):  # one token a step: rounds otherwise than a chunk
        c.feed(0, n1 + i, [OTHER[i]])
    first = rows1.get(0, n1)
    rows1.close()
    native.seq_state_resume(c.ctx, 0, head1)
    c.feed(0, n1, PREFIX[n1:n2])
    head2, rows2 = native.seq_state_save(c.ctx, 0)
    segments = [(0, n1, first), (n1, n2, rows2.get(n1, n2))]
    rows2.close()
    want = c.continue_(0)
    native.seq_state_load(c.ctx, 1, head2, segments)
    got = c.continue_(1)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


@pytest.mark.parametrize("hot_blocks", [0, 8], ids=["unpaged", "paged"])
def test_a_long_sequence_loads_bit_for_bit(demo_llama, hot_blocks):
    """16387 positions: each K or V series is 2 MiB, which a load into host memory copies on
    several threads."""
    c = Context(demo_llama[1], hot_blocks, ctx_per_seq=16512)
    try:
        tokens = [int(t) for t in np.random.default_rng(5).integers(100, 5000, 16387)]
        c.prefill(0, tokens)
        head, rows = native.seq_state_save(c.ctx, 0)
        segments = [(0, len(tokens), rows.get(0, len(tokens)))]
        rows.close()
        want = c.continue_(0, len(tokens))
        native.seq_state_load(c.ctx, 1, head, segments)
        got = c.continue_(1, len(tokens))
        assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    finally:
        c.close()


def test_bytes_that_are_no_state_are_refused(context):
    c = context
    c.prefill(0, PREFIX)
    head, rows = native.seq_state_save(c.ctx, 0)
    n = len(PREFIX)
    whole = [(0, n, rows.get(0, n))]
    bad_heads = (head[:-5], b"\0" * 64, bytes(head[:24]) + b"\1" * (len(head) - 24))
    bad_rows = ([], [(0, n - 1, rows.get(0, n - 1))], [(0, n, rows.get(0, n)[:-1])])
    rows.close()
    for bad, segments in [(h, whole) for h in bad_heads] + [(head, s) for s in bad_rows]:
        c.prefill(1, OTHER)
        with pytest.raises(native.NativeError, match="pyqsa_seq_state_load"):
            native.seq_state_load(c.ctx, 1, bad, segments)
        assert L.llama_memory_seq_pos_max(c.mem, 1) == -1  # left empty
    with pytest.raises(native.NativeError, match="pyqsa_seq_state_save"):
        native.seq_state_save(c.ctx, 2)  # no such sequence
    ffi, lib = native.raw()  # no place for the head or its size
    size, head_ptr = ffi.new("size_t *"), ffi.new("void **")
    ctx = ffi.cast("void *", c.ctx)
    for head_arg, size_arg in ((ffi.NULL, size), (head_ptr, ffi.NULL)):
        rc = lib.pyqsa_seq_state_save(ctx, 0, ffi.NULL, head_arg, size_arg, ffi.NULL)
        assert rc == lib.PYQSA_ERR_INVALID_ARG


def test_a_staged_head_is_the_head_once_filled(context):
    """A save through a stage writes the head less its recurrent and conv states, which the
    stage's fill (on another thread) adds: then it is byte for byte the head saved straight, and
    loads as one. A stage takes one head at a time; a fill with no head drops what it holds."""
    c = context
    c.prefill(0, PREFIX)
    want, rows = native.seq_state_save(c.ctx, 0)
    n = len(PREFIX)
    segments = [(0, n, rows.get(0, n))]
    rows.close()
    stage = native.SeqStage(c.ctx)
    try:
        head, staged_rows = native.seq_state_save(c.ctx, 0, stage)
        staged_rows.staged(stage, lambda s: None)
        # (the bytes left for the stage are whatever the head's new memory held: not compared)
        assert len(head) == len(want)
        # the stage holds bytes of the head (a save that staged none leaves it free): it takes
        # no other save until filled
        with pytest.raises(native.NativeError, match="pyqsa_seq_state_save"):
            native.seq_state_save(c.ctx, 0, stage)
        filler = threading.Thread(target=staged_rows.fill_head)
        filler.start()
        filler.join()
        staged_rows.close()
        assert np.array_equal(head, want)
        native.seq_state_load(c.ctx, 1, head, segments)
        assert all(
            np.array_equal(w, g) for w, g in zip(c.continue_(0), c.continue_(1), strict=True)
        )
        _, dropped_rows = native.seq_state_save(c.ctx, 1, stage)
        released = []
        dropped_rows.staged(stage, released.append)
        dropped_rows.close()  # never filled: dropped, the stage handed back
        assert released == [stage]
        again, again_rows = native.seq_state_save(c.ctx, 1, stage)  # the stage takes one again
        straight, straight_rows = native.seq_state_save(c.ctx, 1)
        straight_rows.close()
        again_rows.staged(stage, released.append)
        again_rows.fill_head()
        again_rows.close()
        assert np.array_equal(again, straight) and released == [stage, stage]
        ffi, lib = native.raw()  # no stage, no context, no place for the stage
        assert lib.pyqsa_seq_stage_fill(ffi.NULL, ffi.NULL, 0) == lib.PYQSA_ERR_INVALID_ARG
        out = ffi.new("pyqsa_seq_stage **")
        assert lib.pyqsa_seq_stage_new(ffi.NULL, out) == lib.PYQSA_ERR_INVALID_ARG
        assert lib.pyqsa_seq_stage_new(ffi.cast("void *", c.ctx), ffi.NULL) == (
            lib.PYQSA_ERR_INVALID_ARG
        )
    finally:
        stage.free()


def test_a_context_on_the_cpu_has_no_rows_reader(context):
    # (rows are read at once there: the reader is for a device stream and its pinned memory)
    assert native.RowsReader.create(context.ctx) is None


def test_a_rows_reader_of_no_context_is_refused():
    with pytest.raises(native.NativeError, match="pyqsa_rows_reader_new failed"):
        native.RowsReader.create(0)
