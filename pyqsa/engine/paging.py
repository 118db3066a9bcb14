"""Where the QSA layers' K/V live: on the device, or paged (pinned host store + device hot cache).

`pyqsa serve --kv-offload auto|host|none --hot-blocks N` end here. The figures come from the
GGUF (through the converter's reader: llama.cpp's metadata strings leave out arrays, and the
compress ratios are one): the layers with a compress ratio above 0 keep K and V of
n_head_kv x head_dim per token in `kv_type`, and one query selects indexer top_k / ratio
blocks of each, which a hot cache must hold (the library refuses less).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KV_OFFLOAD = ("auto", "host", "none")
AUTO_DEVICE_SHARE = 0.8  # auto pages when the K/V would take more of the free device memory
# the CUDA resolve kernel sorts a stream's hot slots in shared memory (PYQSA_PAGE_MAX_SLOTS in
# native/ggml/cuda/qsa-page-resolve.cuh); past it the op would fall back to the CPU
MAX_HOT_BLOCKS_GPU = 8192
_KV_BLOCK = {"f32": (1, 4), "f16": (1, 2), "q8_0": (32, 34)}  # elements, bytes per block


class PagingError(ValueError):
    """A paging setting the model or the machine cannot serve (a one-line message)."""


@dataclass(frozen=True)
class QsaKv:
    """The K/V geometry of a model's QSA layers (those with a compress ratio above 0)."""

    n_layers: int
    n_head_kv: int
    head_dim: int
    top_k: int  # tokens one query selects per layer (the indexer budget)
    ratio: int  # the largest compress ratio: tokens per block
    blocks_selected: int  # blocks one query selects in the layer that selects most

    @classmethod
    def from_gguf(cls, path: str | Path) -> QsaKv:
        from pyqsa.convert import ConvertError
        from pyqsa.convert.gguf_file import GGUFFile
        from pyqsa.convert.qsa import QsaLayout

        try:
            layout = QsaLayout.from_gguf(GGUFFile(path), require_ratios=False)
        except ConvertError as e:
            raise PagingError(str(e)) from None
        except (TypeError, ValueError) as e:  # a key missing or of the wrong type
            raise PagingError(f"{path}: no QSA layout in its metadata ({e})") from None
        ratios = [r for r in layout.ratios if r > 0]
        top_k = max(layout.budgets, default=0)
        return cls(
            n_layers=len(ratios),
            n_head_kv=layout.n_head_kv,
            head_dim=layout.head_dim,
            top_k=top_k,
            ratio=max(ratios, default=0),
            blocks_selected=max((max(1, top_k // r) for r in ratios), default=0),
        )

    @property
    def default_hot_blocks(self) -> int:
        """Twice the blocks one query selects: room for the next steps' selections."""
        return 2 * self.blocks_selected

    def kv_bytes(self, kv_type: str, n_tokens: int) -> int:
        """Bytes of K and V of every QSA layer for `n_tokens` tokens (slots x ctx)."""
        per_block, size = _KV_BLOCK[kv_type]
        row = self.n_head_kv * self.head_dim  # elements of K (or V) per token and layer
        return self.n_layers * 2 * n_tokens * (row // per_block) * size


@dataclass(frozen=True)
class PagingPlan:
    hot_blocks: int  # 0: no paging
    kv_bytes: int  # the QSA K/V of every slot: the host store when paging


def host_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is none (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gpu_devices() -> list:
    """The GPU devices (pyqsa.native.DeviceInfo) in llama.cpp's order: `--gpus` and `--device`
    name indices into this list."""
    from pyqsa import native

    return [d for d in native.devices() if d.type in native.GPU_TYPES]


def device_free(gpu_layers: int | None, gpus: tuple[int, ...] | None = None) -> int | None:
    """Free bytes of the GPUs that hold layers (`gpus` together, or all of them); None on a
    CPU-only build or with --gpu-layers 0 (the K/V are in host memory then anyway)."""
    from pyqsa import native

    if gpu_layers == 0 or native.build_info().backend == "CPU":
        return None
    held = gpu_devices()
    if gpus is not None:
        held = [held[g] for g in gpus if g < len(held)]
    return sum(d.memory_free for d in held) if held else None


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def plan(
    kv: QsaKv,
    kv_offload: str,
    hot_blocks: int | None,
    n_tokens: int,
    kv_type: str,
    free_device: int | None,
    free_host: int | None,
) -> PagingPlan:
    """Paging on or off and the hot cache's size, or a PagingError.

    `auto` pages when the QSA K/V of `n_tokens` (slots x ctx) exceed AUTO_DEVICE_SHARE of
    `free_device` (None: no GPU, no paging). Paging needs host memory (`free_host`, None:
    unknown, not checked) for all of them, and `hot_blocks` (None: the default) at least the
    blocks one query selects."""
    if kv_offload not in KV_OFFLOAD:
        raise PagingError(f"kv_offload must be one of {', '.join(KV_OFFLOAD)}, got {kv_offload!r}")
    need = kv.kv_bytes(kv_type, n_tokens)
    if kv_offload == "none" and hot_blocks is not None:
        raise PagingError("--hot-blocks needs paging; it cannot go with --kv-offload none")
    if hot_blocks is not None and hot_blocks < kv.blocks_selected:
        raise PagingError(
            f"--hot-blocks {hot_blocks} cannot hold the {kv.blocks_selected} blocks one query "
            f"selects (indexer top_k {kv.top_k} / compress ratio {kv.ratio})"
        )
    if kv_offload == "auto":
        pages = free_device is not None and need > AUTO_DEVICE_SHARE * free_device
        kv_offload = "host" if pages else "none"
    if kv_offload == "none" or kv.n_layers == 0:
        if kv_offload == "host":
            raise PagingError("--kv-offload host: the model has no QSA layers to page")
        return PagingPlan(0, need)
    if free_host is not None and need > free_host:
        raise PagingError(
            f"paging needs {gib(need)} of host memory for the QSA K/V ({kv_type}) of "
            f"{n_tokens} tokens (slots x ctx); {gib(free_host)} is available (MemAvailable)"
        )
    return PagingPlan(hot_blocks if hot_blocks is not None else kv.default_hot_blocks, need)
