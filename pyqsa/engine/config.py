"""Engine configuration: one frozen dataclass that checks its own invariants."""

from __future__ import annotations

from dataclasses import dataclass

from .context import ContextConfig
from .scheduler import PREFILL_POLICIES


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs one model.

    `n_slots` sequences run at once, each with room for `ctx_per_slot` tokens (prompt plus
    output); `max_batch_tokens` is the token budget of one step (decode tokens first, then
    prefill chunks shared by `prefill_policy`, "fair" or "fcfs": see scheduler.py);
    `max_prefill_tokens` (0: the same) is the budget of a step with no decode token in it whose
    prompts all need more than `max_batch_tokens`.
    `max_waiting` bounds the queue of requests waiting for a slot, beyond
    which submissions are refused rather than buffered without limit.
    """

    model_path: str
    n_slots: int = 8
    ctx_per_slot: int = 4096
    max_batch_tokens: int = 256
    max_prefill_tokens: int = 0
    max_waiting: int = 64
    n_threads: int = 0  # 0: all cores
    kv_type: str = "f16"  # K/V cache of the indexed layers: f32, f16 or q8_0
    gpu_layers: int | None = None  # layers whose weights go to the GPU; None: all
    # the GPUs (indices among the GPU devices) that hold the layers and their caches: one holds
    # the whole model, several split its layers; None: llama.cpp's default, every GPU
    gpus: tuple[int, ...] | None = None
    # each GPU's share of the layers where they are split (one per GPU of `gpus`, or of every
    # GPU); None: llama.cpp's, by free memory
    tensor_split: tuple[float, ...] | None = None
    seed: int = 0  # seeds requests that give no seed of their own, in arrival order
    prefill_policy: str = "fair"
    # > 0: page the QSA layers' K/V (pinned host store, a device hot cache of this many blocks
    # per slot and layer; see engine/paging.py); 0: they live on the device
    hot_blocks: int = 0
    # with paging, the hot cache's type (None: kv_type); f16 beside a q8_0 kv_type (see context.py)
    kv_hot_type: str | None = None
    # draw tokens inside the forward pass (the sample op, where the logits are), bias and
    # penalties included up to runner.DEVICE_MAX_ADJUST adjusted tokens a draw; False: every
    # sampled row's logits come to the host, where the op's host kernel draws
    sample_on_device: bool = False
    # host bytes the prefix cache may hold (prefix_cache.py); 0 turns it off
    prefix_cache_bytes: int = 0
    # with the cache on, a snapshot every this many tokens inside a prompt (besides those where
    # prompts and replies end), so a prompt that diverges from a cached one midway reuses most
    prefix_stride: int = 16384
    # with the cache on, a prompt's rows are copied every this many tokens while it is computed,
    # so that where it ends (most often beside other slots' decode steps) few are left to copy:
    # 8 x 32K through the server on an H100, 0.950x and 0.956x decode.py's rate at 1024, 0.935x
    # at 4096 (docs/serve.md)
    prefix_rows_ahead: int = 1024
    # the device memory (bytes) the process may hold, `serve --gpu-memory` (device_budget.py):
    # reported in /metrics; 0: no budget (a CPU build)
    device_memory_limit: int = 0

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("model_path is required")
        if self.n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {self.n_slots}")
        if self.ctx_per_slot < 2:
            raise ValueError(f"ctx_per_slot must be >= 2, got {self.ctx_per_slot}")
        if self.max_batch_tokens < self.n_slots:
            # NOTE: every running slot must be able to decode one token per step, or a
            # request could starve behind the others' decode tokens.
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must be >= n_slots ({self.n_slots})"
            )
        if self.max_prefill_tokens and self.max_prefill_tokens < self.max_batch_tokens:
            raise ValueError(
                f"max_prefill_tokens ({self.max_prefill_tokens}) must be >= "
                f"max_batch_tokens ({self.max_batch_tokens})"
            )
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.prefill_policy not in PREFILL_POLICIES:
            raise ValueError(
                f"prefill_policy must be one of {', '.join(PREFILL_POLICIES)}, "
                f"got {self.prefill_policy!r}"
            )
        if self.gpu_layers is not None and self.gpu_layers < 0:
            raise ValueError(f"gpu_layers must be >= 0, got {self.gpu_layers}")
        if self.gpus is not None:
            if not self.gpus or min(self.gpus) < 0 or len(set(self.gpus)) < len(self.gpus):
                raise ValueError(f"gpus must be distinct GPU indices >= 0, got {self.gpus}")
        if self.tensor_split is not None:
            if not self.tensor_split or min(self.tensor_split) < 0 or sum(self.tensor_split) <= 0:
                raise ValueError(
                    f"tensor_split must be shares >= 0, not all 0, got {self.tensor_split}"
                )
            if self.gpus is not None and len(self.tensor_split) != len(self.gpus):
                raise ValueError(
                    f"tensor_split has {len(self.tensor_split)} shares for {len(self.gpus)} gpus"
                )
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {self.prefix_cache_bytes}")
        if self.prefix_stride < 1:
            raise ValueError(f"prefix_stride must be >= 1, got {self.prefix_stride}")
        if self.prefix_rows_ahead < 1:
            raise ValueError(f"prefix_rows_ahead must be >= 1, got {self.prefix_rows_ahead}")
        self.context_config()  # raises ValueError for settings the context refuses

    def context_config(self) -> ContextConfig:
        """The llama context the engine runs on: a KV stream of `ctx_per_slot` per slot."""
        return ContextConfig(
            n_seqs=self.n_slots,
            ctx_per_seq=self.ctx_per_slot,
            n_batch=max(self.max_batch_tokens, self.max_prefill_tokens),
            n_threads=self.n_threads,
            kv_type=self.kv_type,
            hot_blocks=self.hot_blocks,
            kv_hot_type=self.kv_hot_type,
            # a pass outputs the last token of each sampled chunk, a chunk a slot at most
            n_outputs_max=self.n_slots,
        )
