"""The weight floor of a decode step: the weight bytes one step of n sequences must read, and the
time that takes at the GPU's memory bandwidth, the least a step can cost however fast its kernels.

Every tensor of a GGUF is read whole once a step except two kinds: the embedding tables
(token_embd, per_layer_token_embd), of which a step reads one row a token, and the routed experts
(3-D *_exps tensors), of which it reads the experts its tokens pick. With n tokens each picking
k of E experts the step reads E (1 - (1 - k/E)^n) of them on average when routing is uniform
(the synthetic models' random routers route so; a trained router's tokens agree more, which
only lowers the floor): k at one sequence, 7.2 of 8 at eight (top-2).

The bandwidth is the card's nominal figure from its maker (NOMINAL_BANDWIDTH), which kernels
reach only in part, so a step at the floor is a bound, not a target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# nominal memory bandwidth (bytes/s) by a substring of the CUDA device name, most specific first
NOMINAL_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # the 40 GB cards
    ("L40S", 0.864e12),
    ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12),
)
GATHERED = ("token_embd.weight", "per_layer_token_embd.weight")


@dataclass(frozen=True)
class StepWeights:
    dense: int  # bytes read whole every step
    experts: float  # expected bytes of the routed experts the step's tokens pick
    gathered: int  # bytes of the embedding rows the step's tokens look up
    experts_read: float  # expected experts a layer reads

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.gathered


def step_weights(model: Path, n_tokens: int) -> StepWeights:
    """The weight bytes a decode step of `n_tokens` tokens (one a sequence) reads from `model`."""
    from pyqsa.convert.gguf_file import GGUFFile

    g = GGUFFile(model)
    arch = g.get("general.architecture")
    n_expert = int(g.get(f"{arch}.expert_count", 0))
    n_used = int(g.get(f"{arch}.expert_used_count", 0))
    read = n_expert * (1 - (1 - n_used / n_expert) ** n_tokens) if n_expert else 0.0
    dense = gathered = 0
    experts = 0.0
    for t in g.tensors:
        if t.name in GATHERED:
            rows = t.ne[-1]  # ggml order: [width, rows]
            gathered += n_tokens * t.nbytes // rows
        elif "_exps." in t.name and n_expert:
            experts += read * t.nbytes / n_expert
        else:
            dense += t.nbytes
    return StepWeights(dense, experts, gathered, read)


def nominal_bandwidth(gpu: str | None) -> float | None:
    """The maker's memory bandwidth of a CUDA device name, bytes/s; None for one not listed."""
    for part, bw in NOMINAL_BANDWIDTH:
        if gpu and part in gpu:
            return bw
    return None


def floor_ms(weights: StepWeights, gpu: str | None) -> float | None:
    """The time a step takes to read its weights once at the device's nominal bandwidth."""
    bw = nominal_bandwidth(gpu)
    return None if bw is None else weights.total / bw * 1e3
