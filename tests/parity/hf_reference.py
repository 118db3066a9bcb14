"""HF transformers reference (qwen4_exp, eager, f32): logits and QSA selections per query.

HF's own top-k picks among exactly tied block scores in an order that depends on tensor length
(ReLU makes every block whose head dots are all <= 0 score exactly 0.0). The reference here
breaks ties towards the lower block index, the rule pyqsa implements; `hf_tie_order=True`
keeps HF's order so tests can show both agree wherever no tie sits at the cut.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from convert.hf_config import is_indexed


@contextmanager
def _lower_index_wins_topk():
    original = torch.Tensor.topk

    def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - torch's signature
        assert largest, "only the indexer's largest-k is redirected"
        order = torch.sort(self, dim=dim, descending=True, stable=True).indices
        idx = order.narrow(dim, 0, k)
        return torch.return_types.topk((self.gather(dim, idx), idx))

    torch.Tensor.topk = topk
    try:
        yield
    finally:
        torch.Tensor.topk = original


class HFReference:
    def __init__(self, hf_dir: str, hf_tie_order: bool = False):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        self.hf_tie_order = hf_tie_order
        self._masks: dict[int, torch.Tensor] = {}
        self._runs: dict[tuple[int, ...], tuple] = {}
        self._patch = None
        for layer in self.model.model.layers:
            attn = getattr(layer, "self_attn", None)
            if attn is not None:
                attn.indexer.register_forward_pre_hook(self._enter)
                attn.indexer.register_forward_hook(self._leave)

    @property
    def qsa_layers(self) -> list[int]:
        # transformers' name for a QSA layer is its release's (convert/hf_config.py)
        return [i for i, t in enumerate(self.model.config.layer_types) if is_indexed(t)]

    def _enter(self, module, args):
        if not self.hf_tie_order:
            self._patch = _lower_index_wins_topk()
            self._patch.__enter__()

    def _leave(self, module, args, out):
        if self._patch is not None:
            self._patch.__exit__(None, None, None)
            self._patch = None
        self._masks[module.layer_idx] = out.detach()

    def run(self, tokens: list[int]) -> tuple[np.ndarray, dict[int, list[set[int]]]]:
        """Logits [T, vocab] and, per QSA layer, the selected token positions of each query."""
        key = tuple(tokens)
        if key not in self._runs:
            self._runs[key] = self._run(tokens)
        return self._runs[key]

    @torch.no_grad()
    def _run(self, tokens: list[int]):
        self._masks.clear()
        ids = torch.tensor([tokens])
        logits = self.model(input_ids=ids, use_cache=False).logits[0].float().numpy()
        sel = {
            il: [set(torch.nonzero(m[0, 0, p]).flatten().tolist()) for p in range(len(tokens))]
            for il, m in self._masks.items()
        }
        return logits, sel
