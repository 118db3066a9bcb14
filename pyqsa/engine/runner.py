"""The only module that touches llama.cpp: model, tokenizer and one batched forward pass.

One llama context serves every slot: sequence id = slot index, `n_seq_max` = slots. The
model is hybrid (Gated DeltaNet recurrent state + KV cache of the QSA layers), so each
sequence needs its own recurrent state (n_seq_max) and, with `kv_unified` off, its own KV
stream of exactly `ctx_per_slot` cells: a slot can never run another slot out of memory.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
import unicodedata
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from .. import native
from ..gguf_keys import PYQSA_TOKENIZER_NORMALIZER
from .config import EngineConfig
from .context import ContextError, load_model, open_context
from .grammar import Grammar
from .paging import gpu_devices
from .prefix_rows import RowSource
from .scheduler import Chunk

log = logging.getLogger(__name__)


class RunnerError(RuntimeError):
    pass


class RunnerAborted(RunnerError):
    """The forward pass stopped early because `request_abort` was called."""


# logit adjustments (logit bias and penalties) a draw inside the forward pass takes: the size of
# the input of a slot's adjusting device sampler (16 KiB); a draw with more is made on the host
DEVICE_MAX_ADJUST = 1024


def draw_key(draw: dict) -> dict | None:
    """What a draw (native.DeviceSampler.set's keywords) leaves on a device sampler, as a value
    equal for draws that leave the same: a greedy draw reads neither its seed nor its counter
    (pyqsa_sample_params in pyqsa.h), so the draws of a greedy request, and of greedy requests
    after it in the slot, leave the same; None for a draw with logit adjustments (set each time).

    NOTE: a set is a cffi call, which lets go of the GIL, in the host's part of a step: before
    the pass is queued, while the device idles. With the server's 8 greedy streams on a CPU
    stand-in of a GPU step (the engine and server as they are, llama_decode a 0.45 ms wait
    without the GIL, then a 9 ms pass), the 8 sets took 0.10-0.12 ms of the engine's 0.65-0.67
    ms launch a step; skipping the unchanged ones, 0.02 of 0.55-0.58 ms."""
    if draw.get("adjust") is not None:
        return None
    if draw.get("temperature") == 0:
        return {**draw, "seed": 0, "counter": 0}
    return draw


class Runner(Protocol):
    """What the engine needs from a model: a forward pass over a batch and slot cleanup."""

    n_vocab: int
    samples_on_device: bool  # whether `run` takes draws (EngineConfig.sample_on_device)

    def run(
        self,
        chunks: Sequence[Chunk],
        draws: Sequence[dict | None] | None = None,
        on_launch: Callable[[], None] | None = None,
    ) -> Sequence[np.ndarray | native.SampleResult]:
        """Decode `chunks` in one batch; for each chunk with `chunk.sample`, in order, its
        float32 logits row, or, where `draws` (one entry per chunk) gives the parameters of
        native.DeviceSampler.set, the token drawn where the logits are. `on_launch` is called
        once per pass that gets under way (not when it is refused before): on a device that
        runs passes asynchronously, right after the pass is queued, so the caller's work there
        overlaps it; elsewhere right before the pass starts."""
        ...

    def release(self, slot: int) -> None:
        """Forget everything the slot's sequence holds (KV cells and recurrent state)."""
        ...

    def snapshot(self, slot: int) -> tuple[bytes | np.ndarray, RowSource]:
        """The state of the slot's sequence (every position it holds), for `restore`: its head
        (everything but the per-position rows), and where its rows are, to be copied on any
        thread while the slot only grows (native.SeqRows, prefix_rows.py)."""
        ...

    def rows(self, slot: int) -> RowSource:
        """Where the rows of the slot's positions are now, without a head: a prompt's rows are
        copied while it goes on, ahead of its next snapshot (native.SeqRows)."""
        ...

    def restore(
        self, slot: int, head: bytes | np.ndarray, segments: Sequence[tuple[int, int, object]]
    ) -> None:
        """Make the slot's sequence the one `snapshot` saved: its head and its rows as (start,
        end, buffer) segments covering its positions in order (RunnerError, the slot left empty,
        when it does not load)."""
        ...

    def resume(self, slot: int, head: bytes | np.ndarray) -> None:
        """Make the slot's sequence, which holds the saved one's positions and went on past
        them, the one `snapshot` saved: positions past it dropped, the head loaded, the rows
        left in place (RunnerError, the slot left empty, when it does not)."""
        ...

    def request_abort(self) -> None:
        """Stop the forward pass in flight early (any thread): `run` then raises RunnerAborted,
        and every sequence in that pass is left half-computed, to be released. The request
        stands until `clear_abort` (a pass that starts before then is aborted too)."""
        ...

    def clear_abort(self) -> None: ...

    def ledger(self) -> dict[str, int]:
        """Bytes held by category (weights, KV, recurrent state, paging regions...); called
        on the engine thread between steps. Empty when the backend keeps no ledger."""
        ...

    def paging_stats(self) -> dict[str, int] | None:
        """Paging counters since the start (hits, misses, staged, bytes_to_device, bytes_to_host,
        hot_blocks: pyqsa.native.paging_stats); called on the engine thread between steps.
        None when the runner does not page."""
        ...

    def paging_layers(self) -> dict[int, tuple[int, int]] | None:
        """Model layer index -> (hits, misses) of each paged layer since the start
        (pyqsa.native.paging_layers); None when the runner does not page."""
        ...

    def graph_stats(self) -> dict[str, int]:
        """How passes ran their graphs since the start, as far as the backend tells: "reused"
        (passes that kept the previous pass's graph, not building one), and on CUDA "direct"
        (run kernel by kernel), "captured" (into a CUDA graph) and "replayed" (a captured
        graph: pyqsa.native.cuda_graph_counts); cheap, no wait for the device."""
        ...


def _llama():
    import llama_cpp

    return llama_cpp


_init_lock = threading.Lock()
_initialized = False
_log_cb = None  # keeps the ctypes callback alive


def _init_backend() -> None:
    global _initialized, _log_cb
    with _init_lock:
        if _initialized:
            return
        L = _llama()
        L.llama_backend_init()
        if not os.environ.get("PYQSA_LLAMA_LOG"):
            # NOTE: llama.cpp logs every context creation to stderr; the CLI and server
            # keep it quiet unless asked (PYQSA_LLAMA_LOG=1).
            _log_cb = L.llama_log_callback(lambda level, text, data: None)
            L.llama_log_set(_log_cb, None)
        _initialized = True


# The CUDA per-thread stack raised to before the model loads, in bytes (PYQSA_CUDA_STACK_BYTES;
# 0 leaves the driver's, 1024 by default). The driver grows a device's stacks for good, for
# every thread it can hold at once, at the first launch of a kernel whose frame is larger:
# cuBLASLt 13's sm_90 GEMMs (sm90_xmma_gemm_*) have frames of up to 1160 bytes, the largest
# in the libraries a CUDA build loads (read from their cubins), and cuBLAS picks them by shape,
# so the first such shape, mid-run, would grow the device's memory past its start figure.
CUDA_STACK_BYTES = 1160


def reserve_thread_stacks(gpu_layers: int | None, gpus: tuple[int, ...] | None) -> None:
    """Raise the CUDA stacks of the GPUs that hold layers (`gpus`, or all) to
    CUDA_STACK_BYTES now and count them in the ledger; nothing without CUDA."""
    value = os.environ.get("PYQSA_CUDA_STACK_BYTES", str(CUDA_STACK_BYTES))
    if not value.strip().isdigit():
        raise RunnerError(f"PYQSA_CUDA_STACK_BYTES must be a whole number of bytes, got {value!r}")
    if gpu_layers == 0:
        return
    per_thread = int(value)
    for d in gpus if gpus is not None else range(len(gpu_devices())):
        if not native.cuda_stack_reserve(d, per_thread):
            return


class LlamaModel:
    """Loaded weights + vocabulary. Tokenization is thread-safe (llama.h says so)."""

    def __init__(
        self,
        path: str,
        gpu_layers: int | None = None,
        gpus: tuple[int, ...] | None = None,
        tensor_split: tuple[float, ...] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        _init_backend()
        reserve_thread_stacks(gpu_layers, gpus)
        L = _llama()
        self.path = path
        try:
            self.ptr = load_model(
                path, gpu_layers=gpu_layers, gpus=gpus, tensor_split=tensor_split, progress=progress
            )
        except ContextError as e:
            raise RunnerError(str(e)) from None
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab: int = L.llama_vocab_n_tokens(self.vocab)
        self.eos: int = L.llama_vocab_eos(self.vocab)
        self.n_layer: int = L.llama_model_n_layer(self.ptr)
        self._pieces: dict[int, bytes] = {}
        # NOTE: HF's Qwen tokenizers NFC-normalise and llama.cpp's BPE cannot; the converter
        # records it so text is normalised here, as HF would, before llama_tokenize.
        self.normalizer: str | None = self.meta(PYQSA_TOKENIZER_NORMALIZER)

    def meta(self, key: str) -> str | None:
        L = _llama()
        buf = ctypes.create_string_buffer(1 << 16)
        n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Text -> token ids; `special` parses control tokens such as <|im_start|>."""
        L = _llama()
        if self.normalizer:
            text = unicodedata.normalize(self.normalizer, text)
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, False, special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, False, special)
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """Raw bytes of one token as text (control tokens render as nothing)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, special=False)
        return piece

    def control_tokens(self) -> dict[str, int]:
        """Text -> id of the tokens only `tokenize(special=True)` parses, such as <|im_start|>."""
        L = _llama()
        special_only = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_UNKNOWN
        out = {}
        for t in range(self.n_vocab):
            if L.llama_vocab_get_attr(self.vocab, t) & special_only:
                if text := self._piece(t, special=True).decode("utf-8", errors="replace"):
                    out[text] = t
        return out

    def _piece(self, token: int, special: bool) -> bytes:
        L = _llama()
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(_llama().llama_vocab_is_eog(self.vocab, token))

    def grammar(self, text: str) -> Grammar:
        """A reply's state under GBNF `text` (GrammarError when it does not parse)."""
        return Grammar(self.vocab, text)

    def close(self) -> None:
        if self.ptr:
            _llama().llama_model_free(self.ptr)
            self.ptr = None


class LlamaRunner:
    """One llama context with a sequence per slot; used by the engine thread only."""

    def __init__(self, model: LlamaModel, config: EngineConfig) -> None:
        L = _llama()
        self.model = model
        self.n_vocab = model.n_vocab
        try:
            self.ctx = open_context(model.ptr, config.context_config())
        except ContextError as e:
            raise RunnerError(str(e)) from None
        self.mem = L.llama_get_memory(self.ctx)
        # snapshot heads' stages (native.SeqStage), up to one a slot; handed back by the prefix
        # cache's copier thread once it filled their heads
        self._stages: list[native.SeqStage] = []
        self._free_stages: queue.SimpleQueue[native.SeqStage] = queue.SimpleQueue()
        self.max_tokens = config.context_config().n_batch  # the larger of the two step budgets
        # NOTE: with every layer on a GPU llama_decode returns once the pass is queued (the
        # results are waited for when read); on the CPU the call itself computes the pass
        self.passes_async = bool(L.llama_supports_gpu_offload()) and (
            config.gpu_layers is None or config.gpu_layers > model.n_layer
        )
        self.batch = L.llama_batch_init(self.max_tokens, 0, 1)
        self._install_abort()
        self.samples_on_device = config.sample_on_device
        # with device draws every slot keeps a sampler attached (taking up to DEVICE_MAX_ADJUST
        # adjustments), also while idle: attaching or detaching one makes llama.cpp build its
        # scheduler and compute buffers again, so that happens only around a host draw
        self._attached: list[native.DeviceSampler | None] = [None] * config.n_slots
        # per slot, draw_key of the draw its attached sampler holds (None: unknown, set the next)
        self._draw_set: list[dict | None] = [None] * config.n_slots
        if config.sample_on_device:
            try:
                for slot in range(config.n_slots):
                    self._attach(slot)
            except native.NativeError as e:  # a context that cannot take a sampler
                self.close()
                raise RunnerError(str(e)) from None
        # NOTE: with the prefix cache on, every slot's stage is made now. The prompts of a pass
        # may all end in it (8 x 32K through the server: 8 snapshots right after the pass), and
        # a stage made there (the device's pinned host memory, ~75 MB a slot at the full shape)
        # holds up the engine thread while every slot waits for its next step: snapshots in a
        # server window cost the engine 27 ms each (4 in 107 ms, b54706e on an H100), far more
        # than copying their heads at the bus's speed (~3 ms)
        if config.prefix_cache_bytes > 0:
            while len(self._stages) < config.n_slots and (stage := self._new_stage()):
                self._free_stages.put(stage)
        # the prefix cache's copier reads snapshots' rows through it (pinned memory, a stream of
        # its own; PYQSA_ROWS_PAGEABLE=1: each read at once into pageable memory, as before)
        self._reader: native.RowsReader | None = None
        pageable = os.environ.get("PYQSA_ROWS_PAGEABLE", "") not in ("", "0")
        if config.prefix_cache_bytes > 0 and not pageable:
            self._reader = native.RowsReader.create(self.ctx)

    def _install_abort(self) -> None:
        # NOTE: the callback is pyqsa's C function reading _abort_flag, not a Python callable:
        # llama.cpp calls it after every graph node, and a ctypes callback takes the GIL there.
        L = _llama()
        self._abort_flag = ctypes.c_int32(0)
        self._abort_cb = L.ggml_abort_callback(native.abort_flag_callback())
        L.llama_set_abort_callback(self.ctx, self._abort_cb, ctypes.addressof(self._abort_flag))

    def request_abort(self) -> None:
        self._abort_flag.value = 1

    def clear_abort(self) -> None:
        self._abort_flag.value = 0

    def _set_draws(self, chunks: Sequence[Chunk], draws: Sequence[dict | None]) -> None:
        for c, draw in zip(chunks, draws, strict=True):
            if not c.sample:
                continue
            slot = c.lease.slot
            if draw is None:  # drawn here: the row's logits must come back
                self._detach(slot)
                continue
            if self._attached[slot] is None:
                self._attach(slot)
            key = draw_key(draw)
            if key is None or key != self._draw_set[slot]:
                self._attached[slot].set(**draw)
            self._draw_set[slot] = key

    def _attach(self, slot: int) -> None:
        # NOTE: llama.cpp initializes a sampler chain when it is attached and refuses to do it
        # twice, so a slot gets a new sampler each time and the detached one is freed
        sampler = native.DeviceSampler(DEVICE_MAX_ADJUST)
        try:
            native.sampler_attach(self.ctx, slot, sampler)
        except native.NativeError:
            sampler.free()
            raise
        self._attached[slot] = sampler
        self._draw_set[slot] = None  # a new sampler holds no draw yet

    def _detach(self, slot: int) -> None:
        sampler, self._attached[slot] = self._attached[slot], None
        if sampler is not None:
            native.sampler_attach(self.ctx, slot, None)
            sampler.free()

    def run(
        self,
        chunks: Sequence[Chunk],
        draws: Sequence[dict | None] | None = None,
        on_launch: Callable[[], None] | None = None,
    ) -> list[np.ndarray | native.SampleResult]:
        L = _llama()
        try:
            self._set_draws(chunks, draws or [None] * len(chunks))
        except native.NativeError as e:  # a context that cannot take a sampler
            raise RunnerError(str(e)) from None
        n = sum(len(c.tokens) for c in chunks)
        if n > self.max_tokens:  # before writing: the batch arrays hold max_tokens entries
            raise RunnerError(f"batch of {n} tokens exceeds {self.max_tokens}")
        b = self.batch
        i = 0
        rows: list[int] = []
        for c in chunks:
            for j, tok in enumerate(c.tokens):
                b.token[i] = tok
                b.pos[i] = c.start + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = c.lease.slot
                b.logits[i] = c.sample and j == len(c.tokens) - 1
                if b.logits[i]:
                    rows.append(i)
                i += 1
        b.n_tokens = i
        if on_launch is not None and not self.passes_async:
            on_launch()
        rc = L.llama_decode(self.ctx, b)
        if on_launch is not None and self.passes_async:
            on_launch()
        broken = native.take_error()
        if broken:  # a QSA invariant the batch broke: its sequences hold wrong state now
            raise RunnerError(broken)
        if rc == 2:
            raise RunnerAborted("the forward pass was aborted")
        if rc != 0:
            raise RunnerError(f"llama_decode failed with code {rc}")
        out: list[np.ndarray | native.SampleResult] = []
        for c, row in zip([c for c in chunks if c.sample], rows, strict=True):
            attached = self._attached[c.lease.slot]
            if attached is not None:
                out.append(native.sampled_get(self.ctx, row, attached.n_top))
            else:
                ptr = L.llama_get_logits_ith(self.ctx, row)
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        return out

    def release(self, slot: int) -> None:
        _llama().llama_memory_seq_rm(self.mem, slot, -1, -1)
        if self.samples_on_device and self._attached[slot] is None:
            self._attach(slot)  # a host draw took it: idle slots keep the same graphs

    def snapshot(self, slot: int) -> tuple[np.ndarray, native.SeqRows]:
        stage = self._stage()
        try:
            head, rows = native.seq_state_save(self.ctx, slot, stage)
        except native.NativeError as e:
            if stage is not None:
                self._free_stages.put(stage)
            raise RunnerError(str(e)) from None
        if stage is not None:
            rows.staged(stage, self._free_stages.put)
        return head, self._read_through(rows)

    def rows(self, slot: int) -> native.SeqRows:
        try:
            return self._read_through(native.seq_rows_open(self.ctx, slot))
        except native.NativeError as e:
            raise RunnerError(str(e)) from None

    def _read_through(self, rows: native.SeqRows) -> native.SeqRows:
        if self._reader is not None:
            rows.read_through(self._reader)  # (the copier's thread alone reads rows)
        return rows

    def _stage(self) -> native.SeqStage | None:
        """A free stage for a snapshot's head; a new one while there are fewer than slots (the
        prompts of a pass end in at most every slot); None when every one waits for its fill."""
        try:
            return self._free_stages.get_nowait()
        except queue.Empty:
            pass
        if len(self._stages) == len(self._attached):
            return None
        return self._new_stage()

    def _new_stage(self) -> native.SeqStage | None:
        try:
            self._stages.append(native.SeqStage(self.ctx))
        except native.NativeError:
            log.warning("no stage for snapshot heads: this one is copied straight")
            return None
        return self._stages[-1]

    def restore(
        self, slot: int, head: bytes | np.ndarray, segments: Sequence[tuple[int, int, object]]
    ) -> None:
        try:
            native.seq_state_load(self.ctx, slot, head, segments)
        except native.NativeError as e:
            raise RunnerError(str(e)) from None

    def resume(self, slot: int, head: bytes | np.ndarray) -> None:
        try:
            native.seq_state_resume(self.ctx, slot, head)
        except native.NativeError as e:
            raise RunnerError(str(e)) from None

    def ledger(self) -> dict[str, int]:
        return native.ledger(self.ctx)

    def paging_stats(self) -> dict[str, int] | None:
        return native.paging_stats(self.ctx)

    def paging_layers(self) -> dict[int, tuple[int, int]] | None:
        return native.paging_layers(self.ctx)

    def graph_stats(self) -> dict[str, int]:
        reused = {"reused": int(_llama().llama_perf_context(self.ctx).n_reused)}
        return reused | (native.cuda_graph_counts() or {})

    def close(self) -> None:
        L = _llama()
        if self.ctx:
            for stage in self._stages:  # the prefix cache's copier has finished with them
                stage.free()
            if self._reader is not None:
                self._reader.free()
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None
            for sampler in self._attached:  # after the context that held them
                if sampler is not None:
                    sampler.free()
