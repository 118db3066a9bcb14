"""The nodes of one decode step's graph, by op, as the CPU backend computes them (its eval
callback sees every node): what a fusion or a graph change takes out of a step, on any machine.
On CUDA upstream's own fusions then merge some of what is left (rms_norm with its weight, a
unary with its product), so these are the graph's nodes, not the GPU's launches; the GPU's are
in `bench/decode.py --profile`.

    python bench/graph_ops.py MODEL [--seqs 1] [--prompt 300] [--json]
    PYQSA_GATES_UNFUSED=1 python bench/graph_ops.py MODEL      # the same step, unfused
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ops that only describe memory: no kernel on any backend
LAYOUT = {"RESHAPE", "VIEW", "TRANSPOSE", "PERMUTE", "NONE"}


def step_ops(model: str, n_seqs: int, n_prompt: int) -> collections.Counter:
    """Op name -> nodes in the graph of one decode step of n_seqs sequences after an n_prompt
    prompt in each (the nodes with no element, which no backend computes, left out)."""
    import llama_cpp

    from pyqsa import native
    from pyqsa.engine.context import ContextConfig, load_model, open_context

    base = ctypes.CDLL(str(native.lib_dir() / "libggml-base.so.0"))
    base.ggml_op_desc.restype = ctypes.c_char_p
    base.ggml_op_desc.argtypes = [ctypes.c_void_p]
    base.ggml_nelements.restype = ctypes.c_int64
    base.ggml_nelements.argtypes = [ctypes.c_void_p]
    counts: collections.Counter = collections.Counter()
    counting = [False]

    def on_eval(t, ask, _user_data):
        if ask and counting[0] and base.ggml_nelements(t) > 0:
            counts[base.ggml_op_desc(t).decode()] += 1
        return not ask

    callback = llama_cpp.ggml_backend_sched_eval_callback(on_eval)
    llama_cpp.llama_backend_init()
    lm = load_model(model, gpu_layers=0)
    config = ContextConfig(n_seqs=n_seqs, ctx_per_seq=n_prompt + 8, n_batch=n_prompt, n_threads=2)
    ctx = open_context(lm, config, cb_eval=callback)
    try:
        for pos0, n, count in ((0, n_prompt, False), (n_prompt, 1, True)):
            counting[0] = count
            for seqs in [[s] for s in range(n_seqs)] if n > 1 else [list(range(n_seqs))]:
                batch = llama_cpp.llama_batch_init(n * len(seqs), 0, 1)
                for i, (s, j) in enumerate((s, j) for s in seqs for j in range(n)):
                    batch.token[i], batch.pos[i] = 100 + (7 * j + s) % 900, pos0 + j
                    batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, s, True
                batch.n_tokens = n * len(seqs)
                rc = llama_cpp.llama_decode(ctx, batch)
                llama_cpp.llama_batch_free(batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode returned {rc}")
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(lm)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--json", action="store_true", help="one JSON object: op -> nodes")
    a = ap.parse_args(argv)
    counts = step_ops(a.model, a.seqs, a.prompt)
    compute = {op: n for op, n in counts.items() if op not in LAYOUT}
    if a.json:
        print(json.dumps(dict(counts.most_common())))
        return 0
    print(
        f"one decode step of {a.seqs} sequence(s): {sum(counts.values())} nodes, "
        f"{sum(compute.values())} computing"
    )
    for op, n in sorted(compute.items(), key=lambda kv: -kv[1]):
        print(f"{n:7d}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
