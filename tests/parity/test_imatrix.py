"""`pyqsa imatrix` against an independent recomputation: HF's forward pass over the same chunks,
the inputs of its projections and its expert routing hooked, the statistics summed in numpy.

Dense weights: per column, the squared input summed over every token; MoE experts: per expert,
over the tokens routed to it (the gate/up input, and silu(gate) * up for down), and how many.
"""

import numpy as np
import pytest
import torch

from .conftest import RESULTS

CHUNK, CHUNKS = 64, 3
# GGUF weight -> the HF module whose input it multiplies (no converter permutes their columns)
DENSE = {
    "blk.3.attn_q.weight": "model.layers.3.self_attn.q_proj",
    "blk.7.attn_output.weight": "model.layers.7.self_attn.o_proj",  # after sparse attention
    "blk.0.ffn_down_shexp.weight": "model.layers.0.mlp.shared_expert.down_proj",
}
MOE_LAYERS = (0, 3, 7)
TEXT = " ".join(
    f"Line {i}: the indexer picks {i % 7} blocks of four tokens, and expert {i % 5} answers."
    for i in range(120)
)


class HFStatistics:
    """Sums of squared inputs collected from HF forward passes, keyed by GGUF weight names."""

    def __init__(self, model) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}
        modules = dict(model.named_modules())
        for name, module in DENSE.items():
            modules[module].register_forward_pre_hook(self._dense(name))
        for il in MOE_LAYERS:
            modules[f"model.layers.{il}.mlp.experts"].register_forward_pre_hook(self._experts(il))

    def _add(self, name: str, sums: np.ndarray, counts: np.ndarray) -> None:
        if name in self.sums:
            self.sums[name] += sums
            self.counts[name] += counts
        else:
            self.sums[name], self.counts[name] = sums, counts

    def _dense(self, name: str):
        def hook(module, args):
            x = args[0].detach().double().numpy().reshape(-1, args[0].shape[-1])
            self._add(name, (x * x).sum(0)[None], np.array([x.shape[0]]))

        return hook

    def _experts(self, il: int):
        def hook(module, args):
            hidden, top_k = (a.detach() for a in args[:2])
            x_all = hidden.double().numpy()
            w_gate_up = module.gate_up_proj.detach().double().numpy()  # [E, 2 I, H]
            n_exp, n_ff = w_gate_up.shape[0], w_gate_up.shape[1] // 2
            sums = {p: np.zeros((n_exp, d)) for p, d in (("gate", x_all.shape[1]), ("down", n_ff))}
            counts = np.zeros(n_exp, dtype=np.int64)
            for e in range(n_exp):
                x = x_all[(top_k == e).any(-1).numpy()]
                g, u = np.split(x @ w_gate_up[e].T, 2, axis=-1)
                h = g / (1 + np.exp(-g)) * u
                sums["gate"][e], sums["down"][e] = (x * x).sum(0), (h * h).sum(0)
                counts[e] = x.shape[0]
            for part in ("gate", "up", "down"):
                s = sums["down" if part == "down" else "gate"]
                self._add(f"blk.{il}.ffn_{part}_exps.weight", s.copy(), counts.copy())

        return hook


@pytest.fixture(scope="module")
def collected(tiny_ple_gguf, tiny_ple_hf_dir, tmp_path_factory):
    from pyqsa.convert.imatrix import chunks_of, compute_imatrix
    from pyqsa.convert.imatrix_file import read_imatrix

    from pyqsa.engine.runner import LlamaModel

    from .hf_reference import HFReference

    tmp = tmp_path_factory.mktemp("imatrix")
    text = tmp / "text.txt"
    text.write_text(TEXT)
    out = tmp / "imatrix.gguf"
    im = compute_imatrix(tiny_ple_gguf, text, out, chunk=CHUNK, max_chunks=CHUNKS, progress=False)
    model = LlamaModel(str(tiny_ple_gguf))
    runs = chunks_of(model.tokenize(TEXT, special=False), CHUNK, CHUNKS, None)
    model.close()
    ref = HFReference(str(tiny_ple_hf_dir))
    stats = HFStatistics(ref.model)
    with torch.no_grad():
        for toks in runs:
            ref.model(input_ids=torch.tensor([toks]), use_cache=False)
    return im, read_imatrix(out), stats, len(runs)


@pytest.mark.parametrize("name", [*DENSE, *(f"blk.{il}.ffn_down_exps.weight" for il in MOE_LAYERS)])
def test_statistics_match_hf(collected, name):
    im, _, hf, n_runs = collected
    assert im.chunk_count == n_runs == CHUNKS
    e = im.entries[name]
    np.testing.assert_array_equal(e.counts, hf.counts[name])
    err = float(np.abs(e.sums - hf.sums[name]).max() / np.abs(hf.sums[name]).max())
    RESULTS.append(f"imatrix {name}: counts {e.counts.tolist()}, max error / max sum {err:.1e}")
    # f32 weights and K/V on both sides: measured at most 4e-7 of the largest sum
    np.testing.assert_allclose(e.sums, hf.sums[name], rtol=1e-5, atol=1e-6 * hf.sums[name].max())


def test_gate_and_up_see_the_routed_inputs(collected):
    im, _, hf, _ = collected
    for il in MOE_LAYERS:
        gate, up = (im.entries[f"blk.{il}.ffn_{p}_exps.weight"] for p in ("gate", "up"))
        ref = hf.sums[f"blk.{il}.ffn_gate_exps.weight"]
        np.testing.assert_allclose(gate.sums, ref, rtol=1e-5, atol=1e-6 * ref.max())
        np.testing.assert_array_equal(gate.sums, up.sums)  # the same input, bit for bit
        np.testing.assert_array_equal(gate.counts, hf.counts[f"blk.{il}.ffn_gate_exps.weight"])


def test_every_token_counts_once_per_dense_weight(collected):
    im, _, _, _ = collected
    dense = {n: e for n, e in im.entries.items() if e.sums.shape[0] == 1}
    assert len(dense) > 100
    assert {int(e.counts[0]) for e in dense.values()} == {CHUNK * CHUNKS}
    moe = [e for e in im.entries.values() if e.sums.shape[0] > 1]
    # top-2 routing: every token reaches two experts of each MoE weight
    assert moe and all(int(e.counts.sum()) == 2 * CHUNK * CHUNKS for e in moe)


def test_file_round_trips(collected):
    im, read, _, _ = collected
    assert read.entries.keys() == im.entries.keys()
    for name, e in im.entries.items():
        np.testing.assert_array_equal(read.entries[name].sums, e.sums)
        np.testing.assert_array_equal(read.entries[name].counts, e.counts)
    assert (read.chunk_count, read.chunk_size) == (CHUNKS, CHUNK)
