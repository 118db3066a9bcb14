"""Quantized GGUFs of the wide tiny model (rows of 256: the k-quants apply) against HF and
against the f32 file: KL per token within each type's bound, QSA selections at Q8_0 and Q4_K_M,
and Q4_K_M with an importance matrix from `pyqsa imatrix`.

Random weights give nearly flat logits, so KL here is small in absolute terms; the bounds are
about 3x what was measured on the CPU (docs/convert.md, "What quantization costs"), below the
next coarser type's figure, so a file quantized coarser than asked fails.
"""

import pytest

from .compare import tokens
from .conftest import RESULTS
from .quant_measure import NEAR_TIE, PROMPT_LEN, compare, run

# mean KL(HF || ours) per token, nats: measured / bound
KL_BOUND = {
    "Q8_0": 2e-5,  # 6.3e-6
    "Q6_K": 4e-5,  # 1.5e-5
    "Q5_K_M": 1.2e-4,  # 4.4e-5
    "Q4_K_M": 2.5e-4,  # 8.6e-5
    "Q4_K_M+imatrix": 2.5e-4,  # 8.5e-5
    "IQ4_XS": 4e-4,  # 1.3e-4
    "Q4_0": 5e-4,  # 1.6e-4
}
BASE_TYPE = {"Q6_K": "Q6_K", "Q5_K_M": "Q5_K", "Q4_K_M": "Q4_K", "IQ4_XS": "IQ4_XS"}
IMATRIX_TEXT = " ".join(
    f"Paragraph {i}: blocks, experts and streams, {i * 7 % 13}." for i in range(400)
)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    from pyqsa.convert import convert_checkpoint
    from pyqsa.convert.imatrix import compute_imatrix

    from .hf_reference import HFReference
    from .wide_model import wide_checkpoint

    tmp = tmp_path_factory.mktemp("wide")
    hf_dir = wide_checkpoint(tmp)
    f32 = convert_checkpoint(hf_dir, tmp / "f32.gguf", "f32", progress=False)
    toks = tokens(PROMPT_LEN, seed=1)
    ref, _ = HFReference(str(hf_dir)).run(toks)
    (tmp / "text.txt").write_text(IMATRIX_TEXT)
    imatrix = tmp / "imatrix.gguf"
    compute_imatrix(f32, tmp / "text.txt", imatrix, chunk=256, max_chunks=4, progress=False)
    return tmp, f32, toks, ref, run(str(f32), toks), imatrix


_passes: dict[str, object] = {}


def quantized_pass(wide, name: str):
    """The pass of the wide model quantized as `name` ("TYPE" or "TYPE+imatrix"), run once."""
    from pyqsa.convert.inspect import summarize
    from pyqsa.convert.quantize import quantize

    if name not in _passes:
        tmp, f32, toks, _, _, imatrix = wide
        qtype, _, with_imatrix = name.partition("+")
        out = tmp / f"{name}.gguf"
        quantize(f32, out, qtype, imatrix=imatrix if with_imatrix else None, progress=False)
        _passes[name] = (run(str(out), toks), summarize(out).bytes_by_type)
        out.unlink()
    return _passes[name]


@pytest.mark.parametrize("name", list(KL_BOUND))
def test_quantized_logits_within_bound(wide, name):
    _, _, _, ref, f32, _ = wide
    ours, by_type = quantized_pass(wide, name)
    c = compare(ours, ref, f32)
    RESULTS.append(
        f"wide {name}: KL/token vs HF mean {c.kl_mean:.2e} max {c.kl_max:.2e}, vs the f32 file "
        f"{c.kl_f32:.2e}, top-1 {c.top1:.1%}, first selection differing from f32 at query "
        f"{c.first_diff} ({c.n_diff} of {PROMPT_LEN} differ)"
    )
    qtype = name.partition("+")[0]
    if qtype in BASE_TYPE:  # the k-quant really applied, not its 32-element fallback
        assert by_type.get(BASE_TYPE[qtype], 0) > by_type.get("Q8_0", 0) / 2, by_type
    assert c.kl_mean < KL_BOUND[name]
    assert c.kl_f32 < KL_BOUND[name]


def overlap(a: list[set[int]], b: list[set[int]]) -> float:
    """Mean over queries of |a & b| / |b|: the share of the f32 file's selection kept."""
    return sum(len(x & y) / len(y) for x, y in zip(a, b, strict=True)) / len(b)


def test_q8_0_keeps_every_selection_but_near_ties(wide):
    _, _, _, ref, f32, _ = wide
    ours, _ = quantized_pass(wide, "Q8_0")
    c = compare(ours, ref, f32)
    for layer, rows in f32.sel.items():
        clear = int((f32.margin[layer] >= NEAR_TIE).sum())
        RESULTS.append(
            f"wide Q8_0 layer {layer}: first differing query {c.first_diff[layer]}, "
            f"{c.n_diff[layer]} differ, the largest cut margin among them "
            f"{c.flipped_margin[layer]:.3f} of the top score; {clear} queries with a margin >= "
            f"{NEAR_TIE}: all identical"
        )
        # the layers before QSA's are quantized, so a query whose best blocks nearly tie may
        # flip; every other query keeps the f32 file's selection exactly
        assert clear > 50  # 90 and 103 of 300 (the rest: fewer blocks than k, or near-ties)
        assert c.flipped_margin[layer] < NEAR_TIE
        assert overlap(ours.sel[layer], rows) > 0.95


def test_q4_k_m_selections_reported(wide):
    _, _, _, ref, f32, _ = wide
    for name in ("Q4_K_M", "Q4_K_M+imatrix"):
        ours, _ = quantized_pass(wide, name)
        c = compare(ours, ref, f32)
        for layer, rows in f32.sel.items():
            share = overlap(ours.sel[layer], rows)
            RESULTS.append(
                f"wide {name} layer {layer}: first differing query {c.first_diff[layer]}, "
                f"{c.n_diff[layer]} differ (largest cut margin {c.flipped_margin[layer]:.3f}), "
                f"{share:.1%} of the f32 file's selections kept"
            )
            assert c.first_diff[layer] is not None  # 4 bits a weight do move the block scores
            assert share > 0.85
