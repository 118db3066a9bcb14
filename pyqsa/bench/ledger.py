"""Device and host bytes by category (pyqsa_ledger_get) of contexts opened at a shape, with and
without host-backed KV paging; no prefill is needed to size a context. One JSON line each.

    python bench/ledger.py model.gguf --seqs 8 --ctx 32768,262144 --hot-blocks 0,1024

--hot-blocks defaults to 0 (no paging) and the model's default hot cache (twice the blocks one
query selects, as `pyqsa serve` takes).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyqsa import native
from pyqsa.engine.context import ContextConfig, ContextError, load_model, open_context
from pyqsa.engine.paging import PagingError, QsaKv

from .decode import _ints


class LedgerError(RuntimeError):
    """A model or shape the ledger cannot be read at (a one-line message)."""


def default_hot_blocks(model: Path) -> list[int]:
    """0 (no paging) and the model's default hot cache."""
    try:
        return [0, QsaKv.from_gguf(model).default_hot_blocks]
    except PagingError as e:
        raise LedgerError(str(e)) from None


def ledgers(
    model: Path, seqs: int, contexts: list[int], hot_blocks: list[int], ubatch: int = 512
) -> Iterator[dict[str, Any]]:
    """A record per (context, hot blocks): the shape and the ledger of a context opened at it
    as the engine opens its own (logits reserved for a row a sequence), every layer on the GPU
    where there is one."""
    import llama_cpp as L

    try:
        llama_model = load_model(str(model), gpu_layers=999)
    except (FileNotFoundError, ContextError) as e:
        raise LedgerError(str(e)) from None
    try:
        for ctx in contexts:
            for hot in hot_blocks:
                cfg = ContextConfig(
                    n_seqs=seqs, ctx_per_seq=ctx, n_batch=ubatch, hot_blocks=hot, n_outputs_max=seqs
                )
                try:
                    context = open_context(llama_model, cfg)
                except (ValueError, ContextError) as e:
                    raise LedgerError(f"{seqs} x {ctx}, hot_blocks {hot}: {e}") from None
                try:
                    yield {
                        "seqs": seqs,
                        "ctx": ctx,
                        "hot_blocks": hot,
                        "ledger": native.ledger(context),
                    }
                finally:
                    L.llama_free(context)
    finally:
        L.llama_model_free(llama_model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--ctx", type=_ints, default=[262144], help="comma-separated contexts")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--hot-blocks", type=_ints, help="comma-separated; 0: no paging")
    args = ap.parse_args(argv)
    try:
        hot = args.hot_blocks or default_hot_blocks(args.model)
        for rec in ledgers(args.model, args.seqs, args.ctx, hot, args.ubatch):
            print(json.dumps(rec), flush=True)
    except LedgerError as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
