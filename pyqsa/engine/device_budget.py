"""The device-memory budget of `pyqsa serve --gpu-memory GiB`: what the process may hold on its
GPUs (per device; default: what they have free at start).

The budget decides three things. `auto` pages the QSA K/V when they would take over
AUTO_DEVICE_SHARE of what the weights leave of it (engine/paging.py's rule, on the budget instead
of the card). With paging and no --hot-blocks, the hot cache grows into what a first context
leaves of it (a larger hot cache misses less). And start refuses, naming the figures, when the
weights, or the context's categories of the ledger, do not fit.

The ledger (pyqsa.h's pyqsa_ledger) counts pyqsa's and llama.cpp's buffers, ggml's CUDA
memory pool (kernels' temporaries, which grow with the passes that need them, from 0 at the
check) and what the CUDA thread stacks grew past their first figure (raised before the load).
What it cannot see (the CUDA context, loaded kernels, cuBLAS workspaces, graph instances) is
the runtime's reserve, which depends on when CUDA loads the kernels (runtime_reserve).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from .paging import gib

# nvidia-smi's figure minus the ledger's, a paged server of 8 x 262144 on an H100 (b60c8ee):
# 0.65 GiB with each kernel loaded when it first runs (CUDA's lazy loading, its default), 1.31 GiB
# with every kernel loaded when CUDA starts
LAZY_RESERVE = 1 << 30
EAGER_RESERVE = 3 << 29


def load_kernels_at_start() -> None:
    """Have CUDA load every kernel when it starts in this process (CUDA_MODULE_LOADING=EAGER),
    unless the environment names a mode; before the first CUDA call. Loaded as they first run,
    the kernels of a load's first passes that mix decode tokens with prompt chunks took 64 MiB
    more mid-run, past the figure the budget checked at start, which no warm-up pass removed
    (native/PAGING.md): loaded at start, they cost 0.66 GiB more, all of it inside the budget."""
    if not os.environ.get("CUDA_MODULE_LOADING"):
        os.environ["CUDA_MODULE_LOADING"] = "EAGER"


def kernel_loading() -> str:
    """How CUDA loads this process's kernels: CUDA_MODULE_LOADING, LAZY (its default) unset."""
    return os.environ.get("CUDA_MODULE_LOADING", "").strip().upper() or "LAZY"


def runtime_reserve() -> int:
    """The device bytes the ledger cannot see, by how CUDA loads this process's kernels."""
    return EAGER_RESERVE if kernel_loading() == "EAGER" else LAZY_RESERVE


# the share of the room a first context leaves that the hot cache grows into: the rest is margin
# for compute buffers that grow with it (page state) and for the pool's peaks
HOT_FILL = 0.9
LEDGER_NAMES = {  # ledger field -> what a refusal calls it
    "weights": "weights",
    "kv": "K/V",
    "indexer": "block keys",
    "recurrent": "recurrent state",
    "compute": "compute",
    "hot": "hot cache",
    "staging": "staging",
    "tail": "tail",
    "pool": "CUDA pool",
    "stack": "CUDA thread stacks",
}


class BudgetError(ValueError):
    """A setting that does not fit the device budget (a one-line message naming the figures)."""


def device_bytes(ledger: dict[str, int]) -> dict[str, int]:
    """The ledger's device categories that hold bytes, by field name, in the ledger's order."""
    return {f: ledger[f"device.{f}"] for f in LEDGER_NAMES if ledger.get(f"device.{f}")}


@dataclass(frozen=True)
class DeviceBudget:
    limit: int  # bytes the process may hold on the GPUs it uses
    flag: str  # how a message names the budget: "--gpu-memory 24.00 GiB" or "the free ..."
    reserve: int = field(default_factory=runtime_reserve)  # what the ledger cannot see

    @classmethod
    def of(cls, gpu_memory_gib: float | None, free: int, n_devices: int = 1) -> DeviceBudget:
        """--gpu-memory (GiB per device, None: `free`, the bytes free on the GPUs now)."""
        if gpu_memory_gib is None:
            return cls(free, f"the {gib(free)} free on the device")
        if not math.isfinite(gpu_memory_gib) or gpu_memory_gib <= 0:
            raise BudgetError(f"--gpu-memory must be above 0 GiB, got {gpu_memory_gib}")
        limit = int(gpu_memory_gib * 2**30) * n_devices
        if limit > free:
            raise BudgetError(
                f"--gpu-memory {gpu_memory_gib:g} GiB: the GPU has only {gib(free)} free"
            )
        return cls(limit, f"--gpu-memory {gib(limit)}")

    @property
    def usable(self) -> int:
        """What the ledger may hold: the limit less the runtime's own."""
        return self.limit - self.reserve

    def check_weights(self, weights: int) -> None:
        if weights > self.usable:
            raise BudgetError(
                f"the weights take {gib(weights)} of the device; with the CUDA runtime's "
                f"{gib(self.reserve)} that exceeds {self.flag} (try --gpu-layers, or a "
                "quantized model: pyqsa quantize)"
            )

    def kv_room(self, weights: int) -> int:
        """Device bytes the weights leave for a context: what `auto` weighs the K/V against."""
        return max(0, self.usable - weights)

    def check(self, ledger: dict[str, int]) -> None:
        """Refuses a context whose device ledger (with the runtime reserve) exceeds the limit."""
        held = device_bytes(ledger)
        total = sum(held.values()) + self.reserve
        if total > self.limit:
            parts = " + ".join(f"{LEDGER_NAMES.get(k, k)} {gib(v)}" for k, v in held.items())
            raise BudgetError(
                f"this setting needs {gib(total)} of the device ({parts} + CUDA runtime "
                f"{gib(self.reserve)}), over {self.flag}: try fewer --slots, a smaller --ctx "
                "or --prefill-batch-tokens, paging (--kv-offload host) or fewer --hot-blocks"
            )

    def grown_hot_blocks(self, ledger: dict[str, int], hot_blocks: int, most: int) -> int:
        """The hot cache's blocks per slot and layer that fill HOT_FILL of the room a context
        of `hot_blocks` (whose device ledger this is) leaves, at most `most`, at least
        `hot_blocks`. A block's bytes are measured: the ledger's hot bytes over `hot_blocks`."""
        held = device_bytes(ledger)
        per_block = held.get("hot", 0) / hot_blocks
        room = self.usable - sum(held.values())
        if per_block <= 0 or room <= 0:
            return hot_blocks
        return max(hot_blocks, min(most, hot_blocks + int(HOT_FILL * room / per_block)))

    def refit_hot_blocks(self, ledger: dict[str, int], hot_blocks: int, least: int) -> int:
        """The blocks that bring a context of a grown hot cache of `hot_blocks` (its device
        ledger after its warm-up, over the limit) back under it, at least `least`: the bytes
        over, and a tenth more, taken off in blocks. The grown cache is sized on a first
        context's ledger, which can hold less than the engine's after its warm-up: a paged
        8 x 262144 server on an H100 came out 0.36 GiB over --gpu-memory 24 with the 1.5 GiB
        reserve, what a second first context of twice the blocks did not foretell either (it
        is not sized by the hot cache). The first context now makes a pass first (the compute
        buffers its device samplers need; serve's _grow_hot_cache); this stays for what else a
        warm-up may add."""
        held = device_bytes(ledger)
        per_block = held.get("hot", 0) / hot_blocks
        over = sum(held.values()) - self.usable
        if over <= 0 or per_block <= 0:
            return hot_blocks
        return max(least, hot_blocks - math.ceil(over / HOT_FILL / per_block))
