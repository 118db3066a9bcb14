"""Quantized GGUFs of the wide tiny model (rows of 256: the k-quants apply) against HF and
against the f32 file: KL per token within each type's bound, QSA selections at Q8_0.

Random weights give nearly flat logits, so KL here is small in absolute terms; the bounds are
about 3x what was measured on the CPU (docs/convert.md, "What quantization costs"), below the
next coarser type's figure, so a file quantized coarser than asked fails.
"""

import pytest

from .compare import tokens
from .conftest import RESULTS
from .quant_measure import PROMPT_LEN, cost, run

# mean KL(HF || ours) per token, nats: measured / bound
KL_BOUND = {
    "Q8_0": 2e-5,  # 6.3e-6
    "Q6_K": 4e-5,  # 1.5e-5
    "Q5_K_M": 1.2e-4,  # 4.4e-5
    "Q4_K_M": 2.5e-4,  # 8.6e-5
    "IQ4_XS": 4e-4,  # 1.3e-4
    "Q4_0": 5e-4,  # 1.6e-4
}
BASE_TYPE = {"Q6_K": "Q6_K", "Q5_K_M": "Q5_K", "Q4_K_M": "Q4_K", "IQ4_XS": "IQ4_XS"}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    from pyqsa.convert import convert_checkpoint

    from .hf_reference import HFReference
    from .wide_model import wide_checkpoint

    tmp = tmp_path_factory.mktemp("wide")
    hf_dir = wide_checkpoint(tmp)
    f32 = convert_checkpoint(hf_dir, tmp / "f32.gguf", "f32", progress=False)
    toks = tokens(PROMPT_LEN, seed=1)
    ref, _ = HFReference(str(hf_dir)).run(toks)
    _, f32_sel = run(str(f32), toks)
    return tmp, f32, toks, ref, f32_sel


def overlap(a: list[set[int]], b: list[set[int]]) -> float:
    """Mean over queries of |a & b| / |b|: the share of the f32 file's selection kept."""
    return sum(len(x & y) / len(y) for x, y in zip(a, b, strict=True)) / len(b)


@pytest.mark.parametrize("qtype", list(KL_BOUND))
def test_quantized_logits_within_bound(wide, qtype):
    from pyqsa.convert.inspect import summarize
    from pyqsa.convert.quantize import quantize

    tmp, f32, toks, ref, f32_sel = wide
    out = quantize(f32, tmp / f"{qtype}.gguf", qtype, progress=False)
    c = cost(str(out), ref, f32_sel, toks)
    RESULTS.append(
        f"wide {qtype}: KL/token mean {c.kl_mean:.2e} max {c.kl_max:.2e}, top-1 {c.top1:.1%}, "
        f"first selection differing from f32 at query {c.first_diff}"
    )
    by_type = summarize(out).bytes_by_type
    if qtype in BASE_TYPE:  # the k-quant really applied, not its 32-element fallback
        assert by_type.get(BASE_TYPE[qtype], 0) > by_type.get("Q8_0", 0) / 2, by_type
    assert c.kl_mean < KL_BOUND[qtype]
    out.unlink()


def test_q8_0_keeps_qsa_selections(wide):
    from pyqsa.convert.quantize import quantize

    tmp, f32, toks, _, f32_sel = wide
    out = quantize(f32, tmp / "sel-q8_0.gguf", "Q8_0", progress=False)
    _, sel = run(str(out), toks)
    for layer, rows in f32_sel.items():
        share = overlap(sel[layer], rows)
        RESULTS.append(f"wide Q8_0 layer {layer}: {share:.2%} of the f32 file's selections kept")
        # the first QSA layer sees quantized GDN/MoE layers only through its input: its
        # selections may flip at near-ties, never wholesale
        assert share > 0.95
    out.unlink()
