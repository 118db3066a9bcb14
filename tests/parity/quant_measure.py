"""What a quantized GGUF costs against HF and against the f32 file: KL per token, and where the
QSA layers' selections differ from the f32 file's and how close to a tie those queries were
(parity and quantization tests, and the table of docs/convert.md through
`python -m parity.quant_measure [TYPE ...]` from tests/)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyqsa.convert.gguf_file import GGUFFile

from pyqsa import gguf_keys as K

from .compare import tokens
from .llama_runtime import LlamaRuntime

PROMPT_LEN = 300
# a query whose f32 block scores at the top-k cut are closer than this share of its top score is
# a near-tie: any perturbation of the layers before it may flip it. Q8_0 flipped queries up to
# 0.036 on the wide model (0.014 on the tiny ones), Q4_K_M up to 0.145.
NEAR_TIE = 0.08


@dataclass(frozen=True)
class Pass:
    """One prefill of the prompt: logits, and per QSA layer each query's selected cells and its
    cut margin (the gap between the k-th and (k+1)-th best visible block scores over the best
    one; inf where every visible block is selected)."""

    logits: np.ndarray
    sel: dict[int, list[set[int]]]
    margin: dict[int, np.ndarray]


@dataclass(frozen=True)
class Cost:
    kl_mean: float  # KL(HF || ours) per token, nats
    kl_max: float
    kl_f32: float  # mean KL(f32 file || ours) per token
    top1: float  # share of positions whose argmax matches HF's
    first_diff: dict[int, int | None]  # QSA layer -> first query whose selection differs
    n_diff: dict[int, int]  # QSA layer -> queries whose selection differs
    flipped_margin: dict[int, float]  # QSA layer -> the largest f32 margin of a differing query


def kl_per_token(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(ours)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def cut_margins(scores: np.ndarray, k: int, ratio: int) -> np.ndarray:
    """scores [n_q, n_blocks] of a prefill from position 0: each query's cut margin."""
    out = np.full(len(scores), np.inf)
    for p, row in enumerate(scores):
        n_vis = (p + 1) // ratio
        if n_vis > k:
            s = np.sort(row[:n_vis])[::-1]
            out[p] = (s[k - 1] - s[k]) / max(float(s[0]), 1e-30)
    return out


def run(path: str, toks: list[int]) -> Pass:
    """One-shot prefill of `toks` on the positional path."""
    g = GGUFFile(path)
    # per QSA layer: (blocks selected, tokens a block)
    keys = (K.PYQSA_QSA_LAYERS, K.PYQSA_QSA_BUDGET, K.PYQSA_QSA_COMPRESS_RATIO)
    cut = {il: (b // r, r) for il, b, r in zip(*(g.get(k) for k in keys), strict=True)}
    rt = LlamaRuntime(path, n_ctx=512)
    try:
        logits = rt.decode([(0, toks, 0)])[0]
        s = rt.selections
        sel = {il: [q for call in rows for q in call[0]] for il, rows in s.rows.items()}
        margin = {
            il: cut_margins(np.concatenate([c[0, 0] for c in calls]), *cut[il])
            for il, calls in s.scores.items()
        }
        return Pass(logits, sel, margin)
    finally:
        rt.close()


def first_diff(a: list[set[int]], b: list[set[int]]) -> int | None:
    return next((p for p, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def compare(ours: Pass, ref: np.ndarray, f32: Pass) -> Cost:
    """`ours` against HF's logits `ref` and against the f32 file's pass."""
    kl = kl_per_token(ours.logits, ref)
    top1 = float((ours.logits.argmax(-1) == ref.argmax(-1)).mean())
    diffs, n_diff, flipped = {}, {}, {}
    for il in sorted(f32.sel):
        differ = np.array([x != y for x, y in zip(ours.sel[il], f32.sel[il], strict=True)])
        diffs[il] = first_diff(ours.sel[il], f32.sel[il])
        n_diff[il] = int(differ.sum())
        flipped[il] = float(f32.margin[il][differ].max()) if differ.any() else 0.0
    kl_f32 = float(kl_per_token(ours.logits, f32.logits).mean())
    return Cost(float(kl.mean()), float(kl.max()), kl_f32, top1, diffs, n_diff, flipped)


def main() -> None:
    import sys
    import tempfile
    from pathlib import Path

    from pyqsa.convert import convert_checkpoint
    from pyqsa.convert.quantize import quantize

    from .hf_reference import HFReference
    from .wide_model import wide_checkpoint

    types = sys.argv[1:] or ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS"]
    tmp = Path(tempfile.mkdtemp())
    hf_dir = wide_checkpoint(tmp)
    f32_path = str(convert_checkpoint(hf_dir, tmp / "f32.gguf", "f32", progress=False))
    toks = tokens(PROMPT_LEN, seed=1)
    ref, _ = HFReference(str(hf_dir)).run(toks)
    f32 = run(f32_path, toks)
    print(f"f32: {compare(f32, ref, f32)}")
    for t in types:
        for keep in (True, False):
            out = tmp / f"{t}-{keep}.gguf"
            quantize(f32_path, out, t, policy=keep, progress=False)
            mib = out.stat().st_size / 2**20
            print(f"{t} policy={keep} {mib:.1f} MiB: {compare(run(str(out), toks), ref, f32)}")
            out.unlink()


if __name__ == "__main__":
    main()
