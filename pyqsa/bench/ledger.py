"""Device and host bytes by category (pyqsa_ledger_get) of a context opened at a shape, with
and without host-backed KV paging; no prefill is needed to size a context. One JSON line each.

    python bench/ledger.py model.gguf --seqs 8 --ctx 262144 --hot-blocks 0,1024
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyqsa import native
from pyqsa.engine.context import ContextConfig, ContextError, load_model, open_context

from .decode import _ints


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=262144)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument(
        "--hot-blocks", type=_ints, default=[0, 1024], help="comma-separated; 0: no paging"
    )
    args = ap.parse_args(argv)
    import llama_cpp as L

    try:
        model = load_model(str(args.model), gpu_layers=999)
    except (FileNotFoundError, ContextError) as e:
        ap.error(str(e))
    for hot in args.hot_blocks:
        try:
            cfg = ContextConfig(
                n_seqs=args.seqs, ctx_per_seq=args.ctx, n_batch=args.ubatch, hot_blocks=hot
            )
            ctx = open_context(model, cfg)
        except (ValueError, ContextError) as e:
            ap.error(f"hot_blocks {hot}: {e}")
        rec = {"seqs": args.seqs, "ctx": args.ctx, "hot_blocks": hot, "ledger": native.ledger(ctx)}
        print(json.dumps(rec), flush=True)
        L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
