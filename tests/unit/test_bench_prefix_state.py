"""bench/prefix_state.py on the demo model: the bytes a state measures by category are those its
formula gives (which projects the full-shape model's), and every step is timed."""

import json
import os
import subprocess
import sys

from bench_scripts import BENCH


def test_measured_bytes_are_the_formulas(tmp_path):
    out = tmp_path / "state.json"
    env = {**os.environ, "PYQSA_CACHE_DIR": str(tmp_path / "cache")}
    args = [sys.executable, str(BENCH / "prefix_state.py"), "--lengths", "64,203", "--repeats", "1"]
    proc = subprocess.run(
        [*args, "--out", str(out)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    runs, formula = record["runs"], record["formula"]
    assert [(r["tokens"], r["paged"]) for r in runs] == [(64, 0), (64, 1), (203, 0), (203, 1)]
    for r, f in zip(runs, formula, strict=True):
        assert (r["kv_bytes"], r["block_key_bytes"]) == (f["kv"], f["block_keys"]), r
        assert r["rows_bytes"] == f["kv"] + f["block_keys"]
        # the head: the recurrent states and cell metadata, and a few KiB of header, series
        # table and tail block rows
        assert 0 <= r["head_bytes"] - f["recurrent"] - f["cell_meta"] < 8192, r
        steps = ("head_s", "head_fill_s", "head_straight_s", "rows_s", "restore_s", "resume_s")
        assert all(r[k] > 0 for k in steps)
    full = record["full_shape"]
    assert full["tokens"] == 200_000
    assert full["kv"] == 200_000 * 12 * 2 * 2 * 256 * 2  # 24 KiB a token
    assert full["total"] == sum(full[k] for k in ("kv", "block_keys", "recurrent", "cell_meta"))


def test_bad_lengths_are_usage_errors():
    for bad in ("x", "4"):
        proc = subprocess.run(
            [sys.executable, str(BENCH / "prefix_state.py"), "--lengths", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "lengths" in proc.stderr


def test_the_paged_hot_cache_holds_twice_what_one_query_selects(monkeypatch):
    """A paging context refuses a hot cache smaller than one query's selection: 64 blocks, the
    demo model's, cannot hold Flash-Next's 512 (2048 tokens in blocks of 4)."""
    sys.path.insert(0, str(BENCH))
    import prefix_state

    from pyqsa.engine import paging

    flash_next = paging.QsaKv(
        n_layers=12, n_head_kv=2, head_dim=256, top_k=2048, ratio=4, blocks_selected=512
    )
    monkeypatch.setattr(paging.QsaKv, "from_gguf", classmethod(lambda cls, path: flash_next))
    assert prefix_state.hot_blocks("flash-next.gguf") == 1024
    monkeypatch.undo()
    from pyqsa import demo_model

    assert prefix_state.hot_blocks(str(demo_model.demo_model_path())) == 64
