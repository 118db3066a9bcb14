"""What a quantized GGUF costs against HF and against the f32 file: KL per token and the first
position where a QSA layer's selection differs (parity and quantization tests, and the table
of docs/convert.md through `python -m tests.parity.quant_measure`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .compare import tokens
from .llama_runtime import LlamaRuntime

PROMPT_LEN = 300


@dataclass(frozen=True)
class Cost:
    kl_mean: float  # KL(HF || ours) per token, nats
    kl_max: float
    top1: float  # share of positions whose argmax matches HF's
    first_diff: dict[int, int | None]  # QSA layer -> first query whose selection differs


def kl_per_token(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(ours)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def run(path: str, toks: list[int]) -> tuple[np.ndarray, dict[int, list[set[int]]]]:
    """One-shot prefill logits and, per QSA layer, each query's selected cells."""
    rt = LlamaRuntime(path, n_ctx=512)
    try:
        logits = rt.decode([(0, toks, 0)])[0]
        sel = {il: [q for call in rows for q in call[0]] for il, rows in rt.selections.rows.items()}
        return logits, sel
    finally:
        rt.close()


def first_diff(a: list[set[int]], b: list[set[int]]) -> int | None:
    return next((p for p, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def cost(path: str, ref: np.ndarray, ref_sel: dict[int, list[set[int]]], toks) -> Cost:
    logits, sel = run(path, toks)
    kl = kl_per_token(logits, ref)
    top1 = float((logits.argmax(-1) == ref.argmax(-1)).mean())
    diffs = {il: first_diff(sel[il], ref_sel[il]) for il in sorted(ref_sel)}
    return Cost(float(kl.mean()), float(kl.max()), top1, diffs)


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
    f32 = str(convert_checkpoint(hf_dir, tmp / "f32.gguf", "f32", progress=False))
    toks = tokens(PROMPT_LEN, seed=1)
    ref, _ = HFReference(str(hf_dir)).run(toks)
    _, f32_sel = run(f32, toks)
    print(f"f32: {cost(f32, ref, f32_sel, toks)}")
    for t in types:
        for keep in (True, False):
            out = tmp / f"{t}-{keep}.gguf"
            quantize(f32, out, t, keep_f32=keep, progress=False)
            mib = out.stat().st_size / 2**20
            print(f"{t} policy={keep} {mib:.1f} MiB: {cost(str(out), ref, f32_sel, toks)}")
            out.unlink()


if __name__ == "__main__":
    main()
