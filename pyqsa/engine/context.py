"""The one place that loads models and opens llama contexts with pyqsa's settings.

The engine's runner, calibration, the benchmark and the parity harness all open their
contexts here, so a benchmark or a parity run measures the settings the engine serves with
(KV type, flash attention, QSA mode, one KV stream per sequence) rather than its own copy.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from .. import native

log = logging.getLogger(__name__)

KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # ggml_type


class ContextError(RuntimeError):
    """llama.cpp could not load a model or create a context."""


def _llama():
    import llama_cpp

    return llama_cpp


@dataclass(frozen=True)
class ContextConfig:
    """One llama context: `n_seqs` sequences, each in its own KV stream of `ctx_per_seq` cells.

    `n_batch` is the most tokens one llama_decode takes, and its ubatch size. `qsa_mode`:
    "positional" (the engine's path), or "sparse" / "masked" (upstream's per-step pooling, for
    comparison; see pyqsa.h). The positional and sparse paths need flash attention (the V
    cache in rows); without it the QSA layers run upstream's masked attention.
    `op_offload` lets a GPU build run large batches of host-resident weights on the GPU.
    `hot_blocks` > 0 pages the QSA layers' K/V: the whole history in pinned host memory, a hot
    cache of that many blocks per sequence and layer on the device (native/src/qsa-pager.h);
    it must hold the blocks one query selects, and needs the positional mode. `kv_hot_type`
    (None: `kv_type`) is the hot cache's type: "f16" beside a q8_0 `kv_type` keeps the host
    store in q8_0 (half the bytes over the host link) and dequantizes each fetched block.
    `n_outputs_max` is the most rows of logits one pass outputs (0: llama.cpp's default,
    `n_batch`, every token): llama.cpp sizes its compute buffers for that many rows of the
    vocabulary (and, with device samplers, their sampling), so a context that outputs a row a
    sequence at most saves (n_batch - n_seqs) rows of both.
    """

    n_seqs: int = 1
    ctx_per_seq: int = 4096
    n_batch: int = 256
    n_threads: int = 0  # 0: all cores
    kv_type: str = "f16"
    qsa_mode: str = "positional"
    flash_attn: bool = True
    op_offload: bool = True
    hot_blocks: int = 0
    kv_hot_type: str | None = None
    n_outputs_max: int = 0

    def __post_init__(self) -> None:
        for name in ("n_seqs", "ctx_per_seq", "n_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_threads", "n_outputs_max"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}")
        if self.qsa_mode not in native.QSA_MODES:
            modes = ", ".join(native.QSA_MODES)
            raise ValueError(f"qsa_mode must be one of {modes}, got {self.qsa_mode!r}")
        if self.hot_blocks < 0:
            raise ValueError(f"hot_blocks must be >= 0, got {self.hot_blocks}")
        if self.hot_blocks and self.qsa_mode != "positional":
            raise ValueError(f"paging needs qsa_mode positional, got {self.qsa_mode!r}")
        if self.kv_hot_type not in (None, self.kv_type):
            if not self.hot_blocks:
                raise ValueError("kv_hot_type needs paging (hot_blocks > 0)")
            if (self.kv_type, self.kv_hot_type) != ("q8_0", "f16"):
                raise ValueError(
                    f"a {self.kv_hot_type} hot cache needs a q8_0 host store "
                    f"(kv_type q8_0), got kv_type {self.kv_type!r}"
                )

    @property
    def threads(self) -> int:
        return self.n_threads or os.cpu_count() or 1


def gpu_handles() -> list[int]:
    """The GPU devices' ggml_backend_dev_t handles, in llama.cpp's order (the order of
    paging.gpu_devices(), which `gpus` indices follow)."""
    ggml = ctypes.CDLL(str(native.lib_dir() / "libggml.so.0"))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    handles = (ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count()))
    type_of = ggml.ggml_backend_dev_type
    return [h for h in handles if native.DEVICE_TYPES.get(type_of(h)) in native.GPU_TYPES]


def set_gpus(
    params,
    gpus: tuple[int, ...] | None,
    tensor_split: tuple[float, ...] | None,
    handles: Callable[[], list[int]] = gpu_handles,
) -> list:
    """Fill a llama_model_params' GPU fields: `gpus` None leaves llama.cpp's default (layers
    split over every GPU), one GPU holds the whole model and its caches (split mode none, that
    GPU as main_gpu), several split the layers over those GPUs alone (the model's device list);
    `tensor_split` gives each GPU of the split its share of the layers (None: llama.cpp's, by
    free memory). Returns the arrays the params point to, to be kept alive until the load."""
    L = _llama()
    keep: list = []
    if gpus is not None and len(gpus) == 1:
        params.split_mode = L.LLAMA_SPLIT_MODE_NONE
        params.main_gpu = gpus[0]
    elif gpus is not None:
        all_gpus = handles()
        devices = (ctypes.c_void_p * (len(gpus) + 1))(*[all_gpus[g] for g in gpus], None)
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
        params.split_mode = L.LLAMA_SPLIT_MODE_LAYER
        params.main_gpu = 0
        keep.append(devices)
    if tensor_split is not None and (gpus is None or len(gpus) > 1):
        shares = (ctypes.c_float * len(tensor_split))(*tensor_split)
        params.tensor_split = ctypes.cast(shares, type(params.tensor_split))
        keep.append(shares)
    return keep


def load_model(
    path: str,
    gpu_layers: int | None = None,
    extra_bufts: bool = True,
    gpus: tuple[int, ...] | None = None,
    tensor_split: tuple[float, ...] | None = None,
    progress: Callable[[float], None] | None = None,
) -> int:
    """A llama_model pointer for the GGUF at `path`; `gpu_layers` None keeps llama.cpp's
    default (every layer on the GPU when there is one). `gpus`: the GPUs (indices among
    llama.cpp's GPU devices, in their order) that hold the layers, and so their contexts'
    caches, and `tensor_split` their shares (see set_gpus); None keeps llama.cpp's default.
    `progress` is called with the fraction loaded (0..1) as the weights load."""
    L = _llama()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    p = L.llama_model_default_params()
    if gpu_layers is not None:
        p.n_gpu_layers = gpu_layers
    keep = set_gpus(p, gpus, tensor_split)
    p.use_extra_bufts = extra_bufts
    if progress is not None:

        def on_progress(fraction: float, _user_data) -> bool:
            # NOTE: llama.cpp stops loading when this returns false, which is what ctypes
            # returns when the callback raises: a broken display must not stop the load
            try:
                progress(fraction)
            except Exception:
                log.exception("model load progress display failed")
            return True

        keep.append(L.llama_progress_callback(on_progress))  # alive until the load returns
        p.progress_callback = keep[-1]
    model = L.llama_model_load_from_file(path.encode(), p)
    if not model:
        raise ContextError(f"llama.cpp could not load {path}")
    return model


def open_context(
    model: int,
    cfg: ContextConfig,
    cb_eval=None,
    upstream: bool = False,
    cb_eval_user_data: int | None = None,
) -> int:
    """A llama_context pointer for `model` with `cfg`. cb_eval: a
    ggml_backend_sched_eval_callback (kept alive by the caller) to observe tensors, or the
    address of a native one, called with `cb_eval_user_data` (an address).
    upstream: the loaded library is an unpatched llama.cpp (the benchmark's baseline), which
    has no pyqsa settings: qsa_mode does not apply."""
    L = _llama()
    p = L.llama_context_default_params()
    p.n_ctx = cfg.n_seqs * cfg.ctx_per_seq
    p.n_batch = p.n_ubatch = cfg.n_batch
    p.n_seq_max = cfg.n_seqs
    p.n_outputs_max = cfg.n_outputs_max
    p.kv_unified = False  # a stream per sequence: a slot never runs another out of cells
    p.type_k = p.type_v = KV_TYPES[cfg.kv_type]
    p.flash_attn_type = (
        L.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    p.n_threads = p.n_threads_batch = cfg.threads
    p.op_offload = cfg.op_offload
    if cb_eval is not None:
        if isinstance(cb_eval, int):
            cb_eval = L.ggml_backend_sched_eval_callback(cb_eval)
        p.cb_eval = cb_eval
        p.cb_eval_user_data = cb_eval_user_data
    what = f"a context of {cfg.n_seqs} x {cfg.ctx_per_seq} cells"
    if upstream:
        ctx = L.llama_init_from_model(model, p)
        if not ctx:
            raise ContextError(f"llama.cpp could not create {what} (out of memory?)")
    else:
        try:
            hot_type = (
                KV_TYPES[cfg.kv_hot_type] if cfg.kv_hot_type not in (None, cfg.kv_type) else -1
            )
            ctx = native.init_from_model(
                model, ctypes.addressof(p), cfg.qsa_mode, cfg.hot_blocks, hot_type
            )
        except native.NativeError as e:
            raise ContextError(f"llama.cpp could not create {what} (out of memory?): {e}") from None
    if L.llama_n_ctx_seq(ctx) < cfg.ctx_per_seq:
        L.llama_free(ctx)
        raise ContextError(
            f"context per sequence is {L.llama_n_ctx_seq(ctx)}, asked for {cfg.ctx_per_seq}"
        )
    return ctx
