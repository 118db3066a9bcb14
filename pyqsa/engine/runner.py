"""The only module that touches llama.cpp: model, tokenizer and one batched forward pass.

One llama context serves every slot: sequence id = slot index, `n_seq_max` = slots. The
model is hybrid (Gated DeltaNet recurrent state + KV cache of the QSA layers), so each
sequence needs its own recurrent state (n_seq_max) and, with `kv_unified` off, its own KV
stream of exactly `ctx_per_slot` cells: a slot can never run another slot out of memory.
"""

from __future__ import annotations

import ctypes
import os
import threading
import unicodedata
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..convert.names import PYQSA_TOKENIZER_NORMALIZER
from .config import EngineConfig
from .scheduler import Chunk


class RunnerError(RuntimeError):
    pass


class Runner(Protocol):
    """What the engine needs from a model: a forward pass over a batch and slot cleanup."""

    n_vocab: int

    def run(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """Decode `chunks` in one batch; return a [n, n_vocab] float32 logits row for each
        chunk with `chunk.sample`, in order."""
        ...

    def release(self, slot: int) -> None:
        """Forget everything the slot's sequence holds (KV cells and recurrent state)."""
        ...

    def ledger(self) -> dict[str, int]:
        """Bytes held by category (weights, KV, recurrent state, paging regions...); called
        on the engine thread between steps. Empty when the backend keeps no ledger."""
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


class LlamaModel:
    """Loaded weights + vocabulary. Tokenization is thread-safe (llama.h says so)."""

    def __init__(self, path: str) -> None:
        _init_backend()
        L = _llama()
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file not found: {path}")
        params = L.llama_model_default_params()
        self.path = path
        self.ptr = L.llama_model_load_from_file(path.encode(), params)
        if not self.ptr:
            raise RunnerError(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab: int = L.llama_vocab_n_tokens(self.vocab)
        self.eos: int = L.llama_vocab_eos(self.vocab)
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
        p = L.llama_context_default_params()
        p.n_ctx = config.n_ctx
        p.n_batch = p.n_ubatch = config.max_batch_tokens
        p.n_seq_max = config.n_slots
        p.kv_unified = False
        p.n_threads = p.n_threads_batch = config.threads
        self.ctx = L.llama_init_from_model(model.ptr, p)
        if not self.ctx:
            raise RunnerError("llama.cpp could not create a context (out of memory?)")
        if L.llama_n_ctx_seq(self.ctx) < config.ctx_per_slot:
            raise RunnerError(
                f"context per slot is {L.llama_n_ctx_seq(self.ctx)}, "
                f"asked for {config.ctx_per_slot}"
            )
        self.mem = L.llama_get_memory(self.ctx)
        self.max_tokens = config.max_batch_tokens
        self.batch = L.llama_batch_init(self.max_tokens, 0, 1)

    def run(self, chunks: Sequence[Chunk]) -> np.ndarray:
        L = _llama()
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
        if i > self.max_tokens:
            raise RunnerError(f"batch of {i} tokens exceeds {self.max_tokens}")
        b.n_tokens = i
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RunnerError(f"llama_decode failed with code {rc}")
        out = np.empty((len(rows), self.n_vocab), dtype=np.float32)
        for k, row in enumerate(rows):
            ptr = L.llama_get_logits_ith(self.ctx, row)
            out[k] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return out

    def release(self, slot: int) -> None:
        _llama().llama_memory_seq_rm(self.mem, slot, -1, -1)

    def ledger(self) -> dict[str, int]:
        # NOTE: upstream's masked QSA path keeps no ledger; the paging backend will report
        # its regions here (see DESIGN.md 3.3).
        return {}

    def close(self) -> None:
        L = _llama()
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None
