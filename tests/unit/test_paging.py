"""Host-backed KV paging (native/src/qsa-pager.h) against the unpaged positional path on the
demo model (QSA layers select 4 blocks of 4 cells): a hot cache of 4 or 6 blocks per stream,
far smaller than the context, must give the same logits bit for bit, in prefill chunks (read
from the host store in place) and in decode steps (resolved through the hot cache, with
misses and evictions), in several streams at once, after a slot is reused, for f16 and q8_0
K/V. Both contexts see the same token sequence (fed, not sampled)."""

from __future__ import annotations

import ctypes

import llama_cpp as L
import numpy as np
import pytest

from pyqsa import native
from pyqsa.engine.context import ContextConfig, open_context
from pyqsa.engine.runner import LlamaModel

N_SEQS = 2
N_BATCH = 64


@pytest.fixture(autouse=True)
def cuda_core_attention(monkeypatch):
    """On CUDA, unpaged calls with f16 K/V would run qsa_attn on tensor cores, whose
    rounding the paged passes do not reproduce; the CUDA-core kernel they match bit for bit is
    kept (the tensor-core kernel is checked against the CPU op in test-qsa-ops). No effect on
    the CPU."""
    monkeypatch.setenv("PYQSA_QSA_ATTN_MMA", "0")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from pyqsa.demo_model import demo_model_path

    m = LlamaModel(str(demo_model_path(tmp_path_factory.mktemp("demo"))))
    yield m
    m.close()


class Session:
    """One context; feed() decodes chunks of (seq, tokens) and returns each chunk's last logits."""

    def __init__(
        self,
        model: LlamaModel,
        kv_type: str,
        hot_blocks: int,
        kv_hot_type: str | None = None,
        n_outputs_max: int = 0,
    ):
        cfg = ContextConfig(
            n_seqs=N_SEQS,
            ctx_per_seq=1024,
            n_batch=N_BATCH,
            n_threads=2,
            kv_type=kv_type,
            hot_blocks=hot_blocks,
            kv_hot_type=kv_hot_type,
            n_outputs_max=n_outputs_max,
        )
        self.ctx = open_context(model.ptr, cfg)
        self.n_vocab = model.n_vocab
        self.batch = L.llama_batch_init(N_BATCH, 0, 1)
        self.pos = [0] * N_SEQS

    def feed(self, chunks: list[tuple[int, list[int]]]) -> list[np.ndarray]:
        b, i, rows = self.batch, 0, []
        for seq, toks in chunks:
            for j, t in enumerate(toks):
                b.token[i], b.pos[i], b.n_seq_id[i] = t, self.pos[seq] + j, 1
                b.seq_id[i][0], b.logits[i] = seq, j == len(toks) - 1
                i += 1
            self.pos[seq] += len(toks)
            rows.append(i - 1)
        b.n_tokens = i
        assert L.llama_decode(self.ctx, b) == 0, native.take_error()
        out = []
        for r in rows:
            p = ctypes.cast(L.llama_get_logits_ith(self.ctx, r), ctypes.POINTER(ctypes.c_float))
            out.append(np.ctypeslib.as_array(p, (self.n_vocab,)).copy())
        return out

    def copy(self, src: int, dst: int) -> None:
        mem = L.llama_get_memory(self.ctx)
        L.llama_memory_seq_rm(mem, dst, -1, -1)
        L.llama_memory_seq_cp(mem, src, dst, -1, -1)
        self.pos[dst] = self.pos[src]

    def release(self, seq: int) -> None:
        assert L.llama_memory_seq_rm(L.llama_get_memory(self.ctx), seq, -1, -1)
        self.pos[seq] = 0

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)


def script(rng: np.random.Generator) -> list[list[tuple[int, list[int]]]]:
    """Batches: two prompts prefilled in chunks, decode steps of both, then seq 0 reused."""
    tok = lambda n: rng.integers(100, 5000, n).tolist()  # noqa: E731
    steps = [[(0, tok(60))], [(0, tok(40)), (1, tok(24))], [(1, tok(50))]]
    steps += [[(0, tok(33)), (1, tok(7))]]
    steps += [[(0, tok(1)), (1, tok(1))] for _ in range(40)]
    steps += [[(1, tok(1))] for _ in range(10)]
    steps += [["release", 0], [(0, tok(45))]]
    steps += [[(0, tok(1)), (1, tok(1))] for _ in range(30)]
    return steps


def run_equal(paged: Session, whole: Session) -> None:
    """The script on a paged and an unpaged session, every batch's logits equal."""
    for n, step in enumerate(script(np.random.default_rng(7))):
        if step[0] == "release":
            paged.release(step[1])
            whole.release(step[1])
            continue
        for a, b in zip(paged.feed(step), whole.feed(step), strict=True):
            d = np.abs(a - b).max()
            assert np.array_equal(a, b), f"batch {n}: paged logits differ (max |d| {d})"


@pytest.mark.parametrize("hot_blocks", [0, 4], ids=["unpaged", "paged"])
def test_a_row_a_sequence_keeps_the_logits_and_shrinks_the_compute(model, hot_blocks):
    """n_outputs_max = n_seqs, the engine's (a pass outputs a row a sequence at most): the same
    logits bit for bit as llama.cpp's default (a row every token), compute buffers sized for
    N_SEQS rows of the vocabulary instead of N_BATCH."""
    narrow = Session(model, "f16", hot_blocks, n_outputs_max=N_SEQS)
    wide = Session(model, "f16", hot_blocks)
    try:
        run_equal(narrow, wide)
        rows = (N_BATCH - N_SEQS) * model.n_vocab * 4  # the f32 logits of the rows not reserved
        held = [sum(native.ledger(s.ctx)[f"{w}.compute"] for w in ("device", "host"))
                for s in (narrow, wide)]  # fmt: skip
        assert held[0] <= held[1] - rows, (held, rows)
    finally:
        narrow.close()
        wide.close()


def test_the_outputs_a_pass_takes_are_never_negative():
    with pytest.raises(ValueError, match="n_outputs_max must be >= 0, got -1"):
        ContextConfig(n_outputs_max=-1)


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "windows"])
@pytest.mark.parametrize("kv_type,hot_blocks", [("f16", 4), ("f16", 6), ("q8_0", 4)])
def test_paged_logits_equal_unpaged(model, kv_type, hot_blocks, prefetch, monkeypatch):
    """Prefill chunks read the host store through a prefetch area (the unpaged kernels over a
    device copy of the streams' history) or, with PYQSA_PAGING_PREFETCH=0, a window at a time."""
    monkeypatch.setenv("PYQSA_PAGING_PREFETCH", "1" if prefetch else "0")
    paged, whole = Session(model, kv_type, hot_blocks), Session(model, kv_type, 0)
    try:
        run_equal(paged, whole)
        stats = native.paging_stats(paged.ctx)
        assert stats["misses"] > 0 and stats["hits"] > 0 and stats["staged"] > 0, stats
        assert native.paging_stats(whole.ctx) is None
        layers = native.paging_layers(paged.ctx)  # the demo's QSA layers: 3 and 7
        assert sorted(layers) == [3, 7] and native.paging_layers(whole.ctx) is None
        assert sum(h for h, _ in layers.values()) == stats["hits"]
        assert sum(m for _, m in layers.values()) == stats["misses"]
        # the same K/V bytes, all in host memory when paged (up to the buffers' alignment: on
        # CUDA the device and pinned host buffers pad tensors differently); the hot caches beside
        lp, lw = native.ledger(paged.ctx), native.ledger(whole.ctx)
        kv = lw["device.kv"] + lw["host.kv"]
        assert lp["device.kv"] == 0 and kv > 0 and abs(lp["host.kv"] - kv) <= 0.01 * kv, (lp, lw)
        held = {f: lp[f"device.{f}"] + lp[f"host.{f}"] for f in ("hot", "staging", "tail")}
        # staging: the two prefetch areas of one stream's cells of one layer's K and V (kv holds
        # both QSA layers' of N_SEQS streams), or without them nothing: no slot past the hot ones
        area = 2 * kv // (2 * N_SEQS) if prefetch else 0
        assert held["hot"] > 0 and held["tail"] > 0, lp
        assert abs(held["staging"] - area) <= 0.01 * kv, (held, area)
        assert all(lw[f"{w}.{f}"] == 0 for w in ("device", "host") for f in held), lw
    finally:
        paged.close()
        whole.close()


def test_short_chunks_take_the_windows_below_prefetch_min_tokens(model, monkeypatch, capfd):
    """PYQSA_PAGING_PREFETCH_MIN_TOKENS=N: a prefill chunk of fewer than N tokens a stream takes
    the staged windows (only its selected blocks brought), a longer one the prefetch area (its
    streams' whole history): the logits stay the unpaged ones, and the blocks brought are those
    of the windows for every chunk (N above them all), of the prefetch for every chunk (N = 0),
    and in between with the script's 60- and 50-token chunks prefetched and its two-stream ones
    (32 and 20 tokens a stream) through the windows. A value that is no count is ignored, said."""

    def staged(env: dict[str, str]) -> int:
        for k in ("PYQSA_PAGING_PREFETCH", "PYQSA_PAGING_PREFETCH_MIN_TOKENS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        paged, whole = Session(model, "f16", 4), Session(model, "f16", 0)
        try:
            run_equal(paged, whole)
            return native.paging_stats(paged.ctx)["staged"]
        finally:
            paged.close()
            whole.close()

    prefetch, windows = staged({}), staged({"PYQSA_PAGING_PREFETCH": "0"})
    assert windows < prefetch
    assert staged({"PYQSA_PAGING_PREFETCH_MIN_TOKENS": "0"}) == prefetch
    assert staged({"PYQSA_PAGING_PREFETCH_MIN_TOKENS": "1000"}) == windows
    assert windows < staged({"PYQSA_PAGING_PREFETCH_MIN_TOKENS": "40"}) < prefetch
    capfd.readouterr()
    for garbage in ("abc", "-5", "40x"):  # ignored, said on stderr: every chunk prefetched
        assert staged({"PYQSA_PAGING_PREFETCH_MIN_TOKENS": garbage}) == prefetch
        said = f"PYQSA_PAGING_PREFETCH_MIN_TOKENS={garbage} is not a count of tokens: ignored"
        assert said in capfd.readouterr().err


def test_hot_cache_must_hold_one_selection(model):
    with pytest.raises(Exception, match="could not create"):
        open_context(model.ptr, ContextConfig(n_seqs=1, ctx_per_seq=256, n_batch=16, hot_blocks=3))


def test_paging_needs_the_positional_mode():
    with pytest.raises(ValueError, match="positional"):
        ContextConfig(hot_blocks=8, qsa_mode="sparse")


def test_copied_sequence_equal_unpaged(model):
    """A cross-stream copy (llama_memory_seq_cp, as bench/decode.py fills its slots) carries
    the hot cache, ring and page table with the stored K/V."""
    paged, whole = Session(model, "f16", 4), Session(model, "f16", 0)
    rng = np.random.default_rng(3)
    try:
        prompt, first = rng.integers(100, 5000, 50).tolist(), rng.integers(100, 5000, 1).tolist()
        for sess in (paged, whole):
            sess.feed([(0, prompt)])
            sess.feed([(0, first)])  # a decode step: a warm hot cache
            sess.copy(0, 1)
        for n in range(12):
            step = [(s, rng.integers(100, 5000, 1).tolist()) for s in (0, 1)]
            for a, b in zip(paged.feed(step), whole.feed(step), strict=True):
                assert np.array_equal(a, b), f"step {n}: paged logits differ after the copy"
    finally:
        paged.close()
        whole.close()


def test_unread_indexer_cache_holds_no_memory(model):
    """A paging context's indexer cache (kv_size rows per QSA layer, which nothing reads: the
    pager keeps the block keys) is reserved, not committed (native/include/pyqsa-lazy-host.h):
    the ledger's indexer bytes are the pager's key rows (a quarter of the cells at ratio 4),
    where the unpaged context's indexer cache holds a row per cell. 8 hot blocks for 16384
    blocks a stream: prefill stages through 256 block slots (64 windows), the 248 past the hot
    cache counted as staging, beside the two prefetch areas of one stream's cells."""

    def config(hot_blocks: int) -> ContextConfig:
        return ContextConfig(
            n_seqs=4, ctx_per_seq=65536, n_batch=N_BATCH, n_threads=2, hot_blocks=hot_blocks
        )

    paged, whole = open_context(model.ptr, config(8)), open_context(model.ptr, config(0))
    try:
        lp, lw = native.ledger(paged), native.ledger(whole)
        cache = lw["device.indexer"] + lw["host.indexer"]
        held = lp["device.indexer"] + lp["host.indexer"]
        assert cache > 0 and held < cache / 2, (lp, lw)
        # 248 slots x 4 cells x 128 bytes (2 KV heads x 32 f16) x K and V x 4 streams x 2 layers,
        # and 2 areas x K and V x 65536 cells x 128 bytes
        slots, areas = 248 * 4 * 128 * 2 * 4 * 2, 2 * 2 * 65536 * 128
        assert lp["device.staging"] + lp["host.staging"] == slots + areas, lp
    finally:
        L.llama_free(paged)
        L.llama_free(whole)


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "windows"])
def test_f16_hot_cache_over_q8_store(model, prefetch, monkeypatch):
    """A q8_0 host store under an f16 hot cache: the store is written from the f32 rows as the
    unpaged q8_0 cache is, so prefill chunks read through the prefetch area give the unpaged
    q8_0 logits bit for bit; decode steps (and prefill through the staged windows) read f16
    copies of the store's blocks (d * q rounded to f16) and an f16 ring, so they are close to the
    unpaged ones, not equal. The link carries q8_0 blocks: the bytes of the all-q8_0 context."""
    monkeypatch.setenv("PYQSA_PAGING_PREFETCH", "1" if prefetch else "0")
    paged, whole = Session(model, "q8_0", 4, kv_hot_type="f16"), Session(model, "q8_0", 0)
    f16 = Session(model, "f16", 0)  # how far f16 K/V alone moves the logits from q8_0's
    rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())  # noqa: E731
    try:
        worst = gap = 0.0
        for n, step in enumerate(script(np.random.default_rng(7))):
            if step[0] == "release":
                for sess in (paged, whole, f16):
                    sess.release(step[1])
                continue
            prefill = prefetch and all(len(toks) > 1 for _, toks in step)
            for a, b, c in zip(paged.feed(step), whole.feed(step), f16.feed(step), strict=True):
                gap = max(gap, rel(c, b))
                if prefill:
                    assert np.array_equal(a, b), f"batch {n}: prefill logits differ"
                else:
                    worst = max(worst, rel(a, b))
        # within the rounding f16 against q8_0 makes (a wrong block would be far off)
        assert 0.0 < worst <= 1.5 * gap, (worst, gap)
        stats = native.paging_stats(paged.ctx)
        q8_stats = Session(model, "q8_0", 4)
        try:
            for step in script(np.random.default_rng(7)):
                if step[0] == "release":
                    q8_stats.release(step[1])
                else:
                    q8_stats.feed(step)
            ref = native.paging_stats(q8_stats.ctx)
        finally:
            q8_stats.close()
        # every block over the link is a q8_0 block, as in the all-q8_0 context: the bytes per
        # fetched or staged block agree (the counts themselves do on the CPU; on CUDA f16 and
        # q8_0 decode attention round apart, and a later step may select a block or two apart)
        per_block = lambda s: s["bytes_to_device"] / (s["misses"] + s["staged"])  # noqa: E731
        assert stats["misses"] > 0 and per_block(stats) == per_block(ref), (stats, ref)
    finally:
        for sess in (paged, whole, f16):
            sess.close()


def test_f16_hot_cache_needs_a_q8_store():
    with pytest.raises(ValueError, match="needs a q8_0 host store"):
        ContextConfig(hot_blocks=8, kv_type="f16", kv_hot_type="q8_0")
    with pytest.raises(ValueError, match="needs paging"):
        ContextConfig(kv_type="q8_0", kv_hot_type="f16")
