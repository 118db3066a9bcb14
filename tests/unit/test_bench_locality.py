"""bench/synth_model.py --locality: the same model as without it but for the indexer tensors,
whose selections then repeat from one decode step to the next, so the paged KV hot cache hits
(random weights: nearly never). Both --small models, 4096-token prompt, temperature-1 decode,
hot cache 2 x the 16 selected blocks."""

import ctypes
import subprocess
import sys
from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest
from pyqsa.convert.gguf_file import GGUFFile

from pyqsa import native
from pyqsa.engine.context import ContextConfig, open_context
from pyqsa.engine.runner import LlamaModel

BENCH = Path(__file__).resolve().parents[2] / "bench"
PROMPT, STEPS, HOT = 4096, 128, 32
# measured at this shape (bench/README.md): random 0.03, locality 0.89
RANDOM_AT_MOST, LOCALITY_AT_LEAST = 0.15, 0.7


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("locality")
    out = {}
    for kind, flags in (("random", []), ("locality", ["--locality"])):
        out[kind] = d / f"{kind}.gguf"
        cmd = [sys.executable, str(BENCH / "synth_model.py"), str(out[kind]), "--small", *flags]
        proc = subprocess.run(cmd + ["--threads", "2"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_only_the_indexer_tensors_differ(models):
    a, b = GGUFFile(models["random"]), GGUFFile(models["locality"])
    assert a.get("general.name") == "flash-next-synthetic"
    assert b.get("general.name") == "flash-next-synthetic-locality"
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert ta.keys() == tb.keys()
    differ = {n for n in ta if not np.array_equal(a.raw(ta[n]), b.raw(tb[n]))}
    # the QSA layers 3 and 7: query heads paired, the last dim's norm gammas
    assert differ == {
        f"blk.{il}.indexer.{t}.weight" for il in (3, 7) for t in ("q_proj", "q_norm", "k_norm")
    }
    for n in differ:
        assert ta[n].shape == tb[n].shape and ta[n].qtype == tb[n].qtype
    q = b.f32(tb["blk.3.indexer.q_proj.weight"])  # [2 heads x 32, 128]
    assert np.array_equal(q[32:], -q[:32])


def decode_hit_rate(path: Path) -> tuple[float, np.ndarray, list[int]]:
    """Prompt, then temperature-1 decode; the hit rate of the decode steps, the last logits and
    the drawn tokens."""
    model = LlamaModel(str(path))
    cfg = ContextConfig(
        n_seqs=1, ctx_per_seq=PROMPT + STEPS + 8, n_batch=512, n_threads=2, hot_blocks=HOT
    )
    ctx = open_context(model.ptr, cfg)
    batch = L.llama_batch_init(512, 0, 1)
    rng = np.random.default_rng(0)

    def feed(tokens, pos0: int) -> np.ndarray:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(t), pos0 + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        assert L.llama_decode(ctx, batch) == 0, native.take_error()
        p = L.llama_get_logits_ith(ctx, len(tokens) - 1)
        p = ctypes.cast(p, ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(p, (model.n_vocab,)).copy()

    try:
        prompt = rng.integers(0, model.n_vocab, PROMPT)
        for p0 in range(0, PROMPT, 512):
            logits = feed(prompt[p0 : p0 + 512], p0)
        before = native.paging_stats(ctx)
        drawn = []
        for step in range(STEPS):
            assert np.isfinite(logits).all(), f"step {step}: logits not finite"
            prob = np.exp(logits - logits.max(), dtype=np.float64)
            drawn.append(int(rng.choice(model.n_vocab, p=prob / prob.sum())))
            logits = feed(drawn[-1:], PROMPT + step)
        after = native.paging_stats(ctx)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        model.close()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    assert hits + misses > 0
    return hits / (hits + misses), logits, drawn


def test_locality_decode_hits_the_hot_cache(models):
    random, _, _ = decode_hit_rate(models["random"])
    local, logits, drawn = decode_hit_rate(models["locality"])
    assert random <= RANDOM_AT_MOST and local >= LOCALITY_AT_LEAST, (random, local)
    assert np.isfinite(logits).all() and len(set(drawn)) > STEPS // 2  # still a varied decode
