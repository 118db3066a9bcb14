"""A 16K-token context on the tiny model: pyqsa's positional path (block keys stored once, in
place) against the sparse path, which pools every block again from the raw keys with upstream's
code at every ubatch. HF's eager reference is quadratic in context, so the 300-token parity
tests stop far below the 4096 blocks and 64 cache-size steps seen here."""

from .compare import rel_err, tokens
from .llama_runtime import LlamaRuntime

CONTEXT = 16384
CHUNK = 512


def last_chunk(path: str, attn: str, toks: list[int]):
    rt = LlamaRuntime(path, n_ctx=CONTEXT, n_seq=1, n_batch=CHUNK, attn=attn)
    try:
        for i in range(0, CONTEXT - CHUNK, CHUNK):
            rt.decode([(0, toks[i : i + CHUNK], i)])
        rt.selections.rows.clear()
        logits = rt.decode([(0, toks[-CHUNK:], CONTEXT - CHUNK)])[0]
        return logits, {layer: rows[-1][0] for layer, rows in rt.selections.rows.items()}
    finally:
        rt.close()


def test_positional_path_matches_repooling_path_at_16k(tiny_gguf):
    toks = tokens(CONTEXT, seed=7)
    ours, ours_sel = last_chunk(str(tiny_gguf), "positional", toks)
    ref, ref_sel = last_chunk(str(tiny_gguf), "sparse", toks)
    assert ours_sel.keys() == ref_sel.keys() and ours_sel
    for layer, rows in ours_sel.items():
        assert len(rows) == CHUNK
        # the last query sees 4096 blocks and keeps budget 16 + tail < 4 cells, some far back
        assert len(rows[-1]) < 20 and min(rows[-1]) < CONTEXT - CHUNK
        for q, (got, want) in enumerate(zip(rows, ref_sel[layer], strict=True)):
            assert got == want, f"layer {layer} query {CONTEXT - CHUNK + q}: {got ^ want}"
    err = rel_err(ours, ref)
    assert err < 1e-5, f"max relative logit difference {err:.2e}"
