"""What the prefix cache's snapshots cost, on a model (default: the embedded demo model) with
paging off and on, at each of --lengths tokens: the bytes of a state by category and the seconds
of each step, measured on one llama context; and the bytes the same state has on the full-shape
model (bench/synth_model.py's FLASH_NEXT) at --project tokens, from its geometry (the formula is
checked against the measured bytes of the model measured: `bytes_of(config, n)`).

Steps (native/include/pyqsa.h, pyqsa/engine/prefix_reuse.py): `head` is the snapshot's part on
the engine thread (cell metadata, the tail block's rows, and the recurrent and conv states copied
into a stage in pinned memory); `head_fill` the copier thread's copy of the stage into the head;
`head_straight` the head saved without a stage (everything on the engine thread); `rows` the
copy of the per-position rows (QSA K/V, indexer block keys) that the copier thread makes; `restore`
loads head and rows into another slot; `resume` loads the head into the slot that holds the rows
(a follow-up in the slot its prompt left); a follow-up that continues in place costs nothing.

    python bench/prefix_state.py --lengths 8192,32768 --out prefix-state.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from pyqsa.bench.meta import git_commit, source_digest

KV_BYTES = {"f32": 4, "f16": 2}  # per element of the K/V cache types measured here
CELL_META = 36  # per position: llama.cpp's cell metadata of the K/V and indexer caches (measured)


def layer_kinds(config: dict) -> tuple[int, int]:
    """(QSA layers, Gated DeltaNet layers) of an HF config."""
    n = config["num_hidden_layers"]
    kinds = config.get("layer_types")
    if kinds is None:
        every = config["full_attention_interval"]
        kinds = [
            "indexed_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)
        ]
    qsa = sum(k == "indexed_attention" for k in kinds)
    return qsa, n - qsa


def bytes_of(config: dict, n: int, kv_type: str = "f16") -> dict[str, int]:
    """A state of n positions, by category: the rows (QSA K/V; the indexer's block keys, f32,
    one per r positions) and the head (the recurrent and conv states, f32; cell metadata; the
    tail block's raw keys, and with paging its K/V ring rows too, are a few KiB and left out)."""
    qsa, gdn = layer_kinds(config)
    r = config["indexer_compress_ratio"]
    kv = qsa * 2 * config["num_key_value_heads"] * config["head_dim"] * KV_BYTES[kv_type]
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    conv = (config["linear_conv_kernel_dim"] - 1) * (2 * nk * dk + nv * dv) * 4
    return {
        "kv": n * kv,
        "block_keys": (n // r) * qsa * config["indexer_head_dim"] * 4,
        "recurrent": gdn * (nv * dk * dv * 4 + conv),
        "cell_meta": n * CELL_META,
    }


def hot_blocks(path: str) -> int:
    """The paged measurement's hot cache: the model's default (twice the blocks one query
    selects: a paging context with fewer than one query's is refused, PYQSA_ERR_UNSUPPORTED;
    Flash-Next's query selects 2048 / 4 = 512), at least 64 blocks."""
    from pyqsa.engine.paging import QsaKv

    return max(64, QsaKv.from_gguf(path).default_hot_blocks)


def measure(model, path: str, n: int, paged: bool, repeats: int) -> dict:
    from pyqsa import native
    from pyqsa.engine import EngineConfig
    from pyqsa.engine.request import Request, SamplingParams
    from pyqsa.engine.runner import LlamaRunner
    from pyqsa.engine.scheduler import Chunk
    from pyqsa.engine.slots import SlotLease

    step = 2048
    cfg = EngineConfig(
        path,
        n_slots=2,
        ctx_per_slot=n + 64,
        max_batch_tokens=step,
        hot_blocks=hot_blocks(path) if paged else 0,
    )
    runner = LlamaRunner(model, cfg)
    tokens = [int(t) for t in np.random.default_rng(n).integers(200, 20000, n + 8)]
    req = Request("m", tokens, SamplingParams(), lambda ev: None, n + 64)
    lease = SlotLease(0, 0, n + 64)

    def feed(start: int, end: int) -> None:
        for s in range(start, end, step):
            runner.run([Chunk(req, lease, s, tuple(tokens[s : min(end, s + step)]))])

    feed(0, n)
    best = lambda f: min(f() for _ in range(repeats))  # noqa: E731

    def timed(f) -> float:
        t0 = time.perf_counter()
        f()
        return time.perf_counter() - t0

    head, rows = runner.snapshot(0)
    rows.fill_head()  # whole before it is loaded below

    def snapshot() -> tuple[float, float]:  # the engine thread's part, the copier's fill
        t0 = time.perf_counter()
        _, r = runner.snapshot(0)
        t1 = time.perf_counter()
        r.fill_head()
        t2 = time.perf_counter()
        r.close()
        return t1 - t0, t2 - t1

    runs = [snapshot() for _ in range(repeats)]
    t_straight = best(lambda: timed(lambda: native.seq_state_save(runner.ctx, 0)[1].close()))
    data = None

    def copy() -> None:
        nonlocal data
        data = rows.get(0, n)

    t_rows = best(lambda: timed(copy))
    kv_row = rows.size(0, 1)  # one position: no complete block
    r = next(k for k in range(2, n) if rows.size(0, k) != k * kv_row)  # the first block's end
    out = {
        "tokens": n,
        "paged": paged,
        "head_bytes": len(head),
        "rows_bytes": rows.size(0, n),
        "kv_bytes": n * kv_row,
        "block_key_bytes": rows.size(0, n) - n * kv_row,
        "block_key_bytes_per_block": rows.size(0, r) - r * kv_row,
        "head_s": min(a for a, _ in runs),
        "head_fill_s": min(b for _, b in runs),
        "head_straight_s": t_straight,
        "rows_s": t_rows,
        "rows_gb_per_s": rows.size(0, n) / t_rows / 1e9,
    }
    rows.close()

    def restore() -> float:
        runner.release(1)
        return timed(lambda: runner.restore(1, head, [(0, n, data)]))

    out["restore_s"] = best(restore)

    def resume() -> float:
        feed(n, n + 2)  # the slot goes on past the state, as a reply's decode does
        return timed(lambda: runner.resume(0, head))

    out["resume_s"] = best(resume)
    runner.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF model (default: the embedded demo model)")
    ap.add_argument("--lengths", default="8192,32768", help="comma-separated token counts")
    ap.add_argument("--project", type=int, default=200_000, help="tokens of the projection")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each step (the fastest kept)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths: comma-separated token counts, got {args.lengths!r}")
    if not lengths or min(lengths) < 8 or args.repeats < 1 or args.project < 1:
        ap.error("need lengths >= 8, --repeats >= 1 and --project >= 1")

    from pyqsa.engine.runner import LlamaModel

    path = args.model
    config = None
    if path is None:
        from pyqsa import demo_model

        path, config = str(demo_model.demo_model_path()), demo_model.CONFIG
    model = LlamaModel(path)
    from synth_model import FLASH_NEXT

    runs = [measure(model, path, n, paged, args.repeats) for n in lengths for paged in (0, 1)]
    model.close()
    full = bytes_of(FLASH_NEXT, args.project)
    record = {
        "scenario": "prefix_state",
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_commit(),
        "source_digest": source_digest(),
        "model": Path(path).name,
        "runs": runs,
        "formula": [bytes_of(config, r["tokens"]) for r in runs] if config else None,
        "full_shape": {"tokens": args.project, **full, "total": sum(full.values())},
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
