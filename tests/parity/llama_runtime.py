"""Test-side driver of the patched llama.cpp runtime: logits for every position, and the QSA
selection each indexed layer made, read from the graph's "qsa_mask-<layer>" tensor."""

from __future__ import annotations

import ctypes
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from pyqsa.debug import TensorCapture
from pyqsa.engine.context import ContextConfig, load_model, open_context

_SELECTION = re.compile(r"(qsa_mask|qsa_cells|indexer_score)-(\d+)")


@dataclass
class Selections:
    """Selected KV cells per layer: for every decode call, [stream][query row] -> set of cells.

    Read from the graph's "qsa_cells-<layer>" (positional path: I32 cell lists) or
    "qsa_mask-<layer>" (mask paths: finite entries) tensors. `scores`: the block scores the
    selection ranked, per layer and call ("indexer_score-<layer>": positional path
    [1, n_stream, n_tps, n_blocks])."""

    rows: dict[int, list[list[list[set[int]]]]] = field(default_factory=lambda: defaultdict(list))
    scores: dict[int, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))

    def on_tensor(self, name: str, t: np.ndarray) -> None:
        kind, layer = _SELECTION.fullmatch(name).groups()
        if kind == "indexer_score":
            self.scores[int(layer)].append(t)
            return
        if kind == "qsa_mask":  # [n_stream, 1, n_tps, n_kv]
            sets = [[set(np.nonzero(np.isfinite(q))[0].tolist()) for q in s[0]] for s in t]
        else:  # [1, n_stream, n_tps, n_sel], -1 = unused slot
            sets = [[{int(c) for c in q if c >= 0} for q in s] for s in t[0]]
        self.rows[int(layer)].append(sets)


class LlamaRuntime:
    """One model + one context with f32 KV (for parity; kv_type f16 or q8_0 for the quantized
    cache), n_seq sequences in separate streams.

    attn: the context's QSA mode (pyqsa.engine.context.ContextConfig.qsa_mode). "positional":
    block keys kept in the indexer cache, per-step inputs O(n_tokens); "sparse": the selection
    mask of upstream's per-step pooling, then the same sparse attention; both need the V cache
    in rows (flash attention on). "masked": upstream's dense attention under the selection mask.
    on_node: called with the name of every node of every graph computed (pyqsa.debug.TensorCapture).
    """

    def __init__(
        self,
        path: str,
        n_ctx: int = 1024,
        n_seq: int = 1,
        n_batch: int = 1024,
        attn: str = "positional",
        kv_type: str = "f32",
        on_node=None,
    ):
        llama_cpp.llama_backend_init()
        # the GPU machine runs the same tests with every layer offloaded (tests/gpu/parity.sh)
        n_gpu_layers = int(os.environ.get("PYQSA_TEST_N_GPU_LAYERS", "0"))
        self.model = load_model(path, gpu_layers=n_gpu_layers)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.selections = Selections()
        self._capture = TensorCapture(_SELECTION.pattern, self.selections.on_tensor, on_node)
        cfg = ContextConfig(
            n_seqs=n_seq,
            ctx_per_seq=n_ctx,
            n_batch=n_batch,
            n_threads=2,
            kv_type=kv_type,
            qsa_mode=attn,
            flash_attn=attn != "masked",
            # with weights on the host, a CUDA build still runs batches of 32+ tokens on the
            # GPU (op offload); a run asked to stay on the CPU must really stay there
            op_offload=n_gpu_layers > 0,
        )
        self.ctx = open_context(self.model, cfg, cb_eval=self._capture.callback)

    def close(self) -> None:
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)

    def decode(self, chunks: list[tuple[int, list[int], int]]) -> dict[int, np.ndarray]:
        """Decode one batch. chunks: (seq_id, tokens, first position). Returns, per seq_id,
        the logits [len(tokens), n_vocab] of every token of its chunk."""
        n = sum(len(t) for _, t, _ in chunks)
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            i = 0
            rows: dict[int, list[int]] = {}
            for seq, tokens, pos0 in chunks:
                rows[seq] = []
                for j, tok in enumerate(tokens):
                    batch.token[i] = tok
                    batch.pos[i] = pos0 + j
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq
                    batch.logits[i] = True
                    rows[seq].append(i)
                    i += 1
            batch.n_tokens = n
            rc = llama_cpp.llama_decode(self.ctx, batch)
            self._capture.raise_pending()
            assert rc == 0, f"llama_decode returned {rc}"
            out = {}
            for seq, idx in rows.items():
                out[seq] = np.stack(
                    [
                        np.ctypeslib.as_array(
                            ctypes.cast(
                                llama_cpp.llama_get_logits_ith(self.ctx, k),
                                ctypes.POINTER(ctypes.c_float),
                            ),
                            shape=(self.n_vocab,),
                        ).copy()
                        for k in idx
                    ]
                )
            return out
        finally:
            llama_cpp.llama_batch_free(batch)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        self.selections.rows.clear()
        self.selections.scores.clear()
