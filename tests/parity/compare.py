"""What the parity checks compare with: random prompts and the relative logit error. No torch,
so the GPU machine's CUDA-vs-CPU script can use it too."""

import numpy as np


def tokens(n: int, seed: int) -> list[int]:
    """n random token ids below the Qwen vocab's special tokens."""
    return np.random.default_rng(seed).integers(0, 151643, n).tolist()


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """Max over positions of max|ours - ref| / max|ref| (per position)."""
    return float((np.abs(ours - ref).max(-1) / np.abs(ref).max(-1)).max())
