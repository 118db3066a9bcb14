"""The converter's per-head KV scales hold the right values in the documented order (indexed
layer-major, then KV head): calibration against K and V captured from HF's own forward pass on
the same tokens; the weight estimate against the HF checkpoint's tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from parity.hf_reference import HFReference
from pyqsa.convert import names as N
from pyqsa.convert.calibrate import Z_MARGIN, calibrate
from pyqsa.convert.gguf_file import GGUFFile
from pyqsa.convert.qsa import QsaLayout
from safetensors.numpy import load_file

from pyqsa.engine.runner import LlamaModel

TEXT = "The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸 🦊 x = f(y)\n" * 6


@pytest.fixture(scope="module")
def layout(tiny_gguf) -> QsaLayout:
    return QsaLayout.from_gguf(GGUFFile(tiny_gguf))


def hf_kv_absmax(hf_dir, tokens: list[int], layers) -> tuple[np.ndarray, np.ndarray]:
    """Absmax per (indexed layer, KV head) of K (after k_norm and RoPE) and V in HF."""
    import transformers.models.qwen4_exp.modeling_qwen4_exp as hf

    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    eager = hf.eager_attention_forward

    def capture(module, query, key, value, *args, **kwargs):
        # key, value: [batch, n_head_kv, tokens, head_dim], before repeat_kv
        seen[module.layer_idx] = (key.abs().amax(dim=(0, 2, 3)), value.abs().amax(dim=(0, 2, 3)))
        return eager(module, query, key, value, *args, **kwargs)

    hf.eager_attention_forward = capture
    try:
        HFReference(str(hf_dir)).run(tokens)
    finally:
        hf.eager_attention_forward = eager
    k = np.concatenate([seen[il][0].numpy() for il in layers])
    v = np.concatenate([seen[il][1].numpy() for il in layers])
    return k, v


def test_calibrated_scales_are_hf_absmax_per_head(tiny_gguf, tiny_hf_dir, layout):
    scales = calibrate(tiny_gguf, layout, TEXT, nfc=True)
    tokens = LlamaModel(str(tiny_gguf)).tokenize(TEXT, special=False)
    assert scales.source == f"calibrated:{len(tokens)} tokens"
    k, v = hf_kv_absmax(tiny_hf_dir, tokens, layout.layers)
    assert len(scales.k) == len(k) == layout.n_scales
    # every head has its own value, so a swap of heads or layers would show
    assert len({round(x, 3) for x in scales.k}) == len(k)
    assert len({round(x, 3) for x in scales.v}) == len(v)
    np.testing.assert_allclose(scales.k, k, rtol=1e-3)
    np.testing.assert_allclose(scales.v, v, rtol=1e-3)


def test_weight_estimate_from_the_hf_tensors(tiny_gguf, tiny_hf_dir, layout):
    """What the converter wrote: the estimate's documented formula (calibrate.weight_estimate),
    recomputed from the HF checkpoint's own tensors."""
    g = GGUFFile(tiny_gguf)
    assert g.get(N.PYQSA_KV_SCALES_SOURCE) == "weight-estimate"
    hf = load_file(str(tiny_hf_dir / "model.safetensors"))
    D, H, E = layout.head_dim, layout.n_head_kv, layout.n_embd
    k, v = [], []
    for il in layout.layers:
        p = f"model.layers.{il}."
        gamma = np.abs(hf[p + "self_attn.k_norm.weight"].astype(np.float64) + 1)
        k += [gamma.max() * min(Z_MARGIN, math.sqrt(D))] * H
        hc = (hf[p + "attn_hyper_connection.hc_norm.weight"].astype(np.float64) + 1).reshape(-1, E)
        rho, rho_max = np.sqrt((hc**2).mean(axis=1)).max(), np.abs(hc).max()
        rows = np.linalg.norm(hf[p + "self_attn.v_proj.weight"].astype(np.float64), axis=1)
        for h in range(H):
            r = rows[h * D : (h + 1) * D].max()
            v.append(min(Z_MARGIN * rho * r, math.sqrt(E) * rho_max * r))
    # stored as float32
    np.testing.assert_allclose(g.get(N.PYQSA_KV_SCALES_K), k, rtol=1e-6)
    np.testing.assert_allclose(g.get(N.PYQSA_KV_SCALES_V), v, rtol=1e-6)
