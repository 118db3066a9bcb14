"""One model and, per context length, one llama context: the prefill and decode steps that
bench/decode.py (pyqsa.bench.decode) times; see that module's docstring for what is measured."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pyqsa.engine.context import ContextConfig, ContextError, load_model, open_context

from .kernels import KernelProfile, table

PROFILE_CHUNKS = 2  # prefill batches a --profile run records (the last ones: the longest context)


class BenchError(RuntimeError):
    pass


class Bench:
    """One model and, per context length, one llama context (see the module docstring)."""

    def __init__(self, L: Any, model: Path, args: argparse.Namespace) -> None:
        self.L, self.args = L, args
        L.llama_backend_init()
        if not os.environ.get("PYQSA_LLAMA_LOG"):
            self._log_cb = L.llama_log_callback(lambda level, text, data: None)
            L.llama_log_set(self._log_cb, None)
        self.gpu = bool(L.llama_supports_gpu_offload())
        t0 = time.perf_counter()
        try:
            self.model = load_model(
                str(model),
                gpu_layers=args.gpu_layers if self.gpu else 0,
                extra_bufts=not args.no_extra_bufts,
            )
        except ContextError as e:
            raise BenchError(str(e)) from None
        self.load_s = time.perf_counter() - t0
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.rng = np.random.default_rng(args.seed)
        self.ctx = None
        self.samplers: list[Any] = []  # --sampling device: one per sequence, attached
        self.profiles: list[str] = []  # --profile: the kernel tables so far

    def config(self, context: int, n_seq: int) -> ContextConfig:
        """The engine's context settings (pyqsa.engine.context) at this shape."""
        a = self.args
        return ContextConfig(
            n_seqs=n_seq,
            ctx_per_seq=context,
            n_batch=a.ubatch,
            n_threads=a.threads,
            kv_type=a.kv_type,
            qsa_mode=a.qsa_mode,
            hot_blocks=a.hot_blocks,
            kv_hot_type=a.kv_hot_type,
        )

    def open(self, context: int, n_seq: int) -> dict[str, Any]:
        """Open the context; returns the flags it ran with, for the records."""
        L, a = self.L, self.args
        cfg = self.config(context, n_seq)
        try:
            self.ctx = open_context(self.model, cfg, upstream=a.variant == "upstream")
        except ContextError as e:
            raise BenchError(str(e)) from None
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(max(a.ubatch, n_seq), 0, 1)
        if a.sampling == "device":
            from pyqsa import native

            # one seed for all: copies of sequence 0 must then draw its token
            for s in range(n_seq):
                sampler = native.DeviceSampler()
                sampler.set(temperature=1.0, seed=a.seed)
                native.sampler_attach(self.ctx, s, sampler)
                self.samplers.append(sampler)
        return {
            "n_gpu_layers": a.gpu_layers if self.gpu else 0,
            "flash_attn": "enabled" if cfg.flash_attn else "disabled",
            "type_k": cfg.kv_type,
            "type_v": cfg.kv_type,
            "kv_unified": False,
            "n_ctx": cfg.n_seqs * cfg.ctx_per_seq,
            "n_seq_max": cfg.n_seqs,
            "n_batch": cfg.n_batch,
            "n_ubatch": cfg.n_batch,
            "n_threads": cfg.threads,
            "use_extra_bufts": not a.no_extra_bufts,
            "qsa_mode": cfg.qsa_mode if a.variant == "pyqsa" else "upstream (masked dense)",
            "hot_blocks": cfg.hot_blocks,
            "hot_type": cfg.kv_hot_type or cfg.kv_type,
            "sampling": a.sampling,
        }

    def ledger(self) -> dict[str, Any]:
        """pyqsa's bytes by category for the open context (capacity evidence, pyqsa.native)
        and, when it pages, its hit/miss and host-link counters so far; nothing for upstream's
        library, which has neither."""
        if self.args.variant != "pyqsa":
            return {}
        from pyqsa import native

        paging = native.paging_stats(self.ctx)
        if paging:
            paging["layers"] = native.paging_layers(self.ctx)
        return {"ledger": native.ledger(self.ctx), **({"paging": paging} if paging else {})}

    def graph_counts(self) -> dict[str, int]:
        """Passes so far that kept their graph (llama.cpp's count), and with pyqsa's library on
        CUDA how the backend ran graphs (pyqsa.native.cuda_graph_counts)."""
        out = {"reused": int(self.L.llama_perf_context(self.ctx).n_reused)}
        if self.args.variant == "pyqsa":
            from pyqsa import native

            out |= native.cuda_graph_counts() or {}
        return out

    def close(self) -> None:
        if self.ctx:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.ctx = None
            for sampler in self.samplers:  # after the context that held them
                sampler.free()
            self.samplers = []

    def _set(self, tokens: np.ndarray, pos: np.ndarray, seqs: np.ndarray, logits: bool) -> None:
        b, n = self.batch, len(tokens)
        np.ctypeslib.as_array(b.token, shape=(n,))[:] = tokens
        np.ctypeslib.as_array(b.pos, shape=(n,))[:] = pos
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        out = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), (n,))
        out[:] = 0
        if logits:
            out[:] = 1
        else:
            out[-1] = 1
        for i, s in enumerate(seqs):
            b.seq_id[i][0] = int(s)
        b.n_tokens = n

    def _decode(self) -> None:
        rc = self.L.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise BenchError(f"llama_decode returned {rc}")

    @contextlib.contextmanager
    def _profiled(self, title: str, per: int) -> Iterator[None]:
        """Records the kernels of the block as a table titled `title`, per `per` batches or
        steps (--profile); nothing without --profile."""
        if not self.args.profile:
            yield
            return
        with KernelProfile() as kp:
            yield
            self.L.llama_synchronize(self.ctx)
        self.profiles.append(table(title, kp.rows, per))

    def prefill(self, context: int) -> float:
        """Fill sequence 0 with `context` random tokens; return the seconds it took (after
        --prefill-warmup untimed batches, removed again)."""
        ub = self.args.ubatch
        warm = list(range(0, min(context, self.args.prefill_warmup * ub), ub))
        if warm:
            self._prefill_batches(warm, context)
            self.L.llama_synchronize(self.ctx)
            self.L.llama_memory_seq_rm(self.mem, 0, -1, -1)
        starts = list(range(0, context, ub))
        n_last = min(PROFILE_CHUNKS, len(starts)) if self.args.profile else 0
        t0 = time.perf_counter()
        self._prefill_batches(starts[: len(starts) - n_last], context)
        with self._profiled(f"prefill, the batches of {ub} up to {context} tokens", n_last):
            self._prefill_batches(starts[len(starts) - n_last :], context)
        self.L.llama_synchronize(self.ctx)
        return time.perf_counter() - t0

    def _prefill_batches(self, starts: list[int], context: int) -> None:
        for p0 in starts:
            n = min(self.args.ubatch, context - p0)
            self._set(
                self.rng.integers(0, self.n_vocab, n, dtype=np.int32),
                np.arange(p0, p0 + n, dtype=np.int32),
                np.zeros(n, np.int32),
                False,
            )
            self._decode()

    def copy_seq0(self, n_seq: int) -> int:
        """Make sequences 1..n_seq-1 copies of sequence 0; return the next position."""
        L, mem = self.L, self.mem
        for s in range(1, n_seq):
            L.llama_memory_seq_rm(mem, s, -1, -1)
            L.llama_memory_seq_cp(mem, 0, s, -1, -1)
        # NOTE: pos_min of a hybrid memory is the recurrent state's (the last position), so
        # only pos_max is checked here; the first decode step checks the copied contents
        end = L.llama_memory_seq_pos_max(mem, 0)
        for s in range(1, n_seq):
            if L.llama_memory_seq_pos_max(mem, s) != end:
                got = L.llama_memory_seq_pos_max(mem, s)
                raise BenchError(f"sequence {s} ends at position {got}, sequence 0 at {end}")
        return end + 1

    def logits(self, n: int) -> np.ndarray:
        ptr = self.L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab)).copy()

    def decode(self, n_seq: int, pos: int, fresh_copies: bool) -> dict[str, Any]:
        """Warmup + timed steps with all n_seq sequences in each batch. Only while the copies
        of sequence 0 are fresh (no step decoded since copy_seq0) must their logits agree."""
        a = self.args
        seqs = np.arange(n_seq, dtype=np.int32)
        times, launches, check = [], [], {}
        profiled = contextlib.ExitStack()
        for step in range(a.warmup + a.steps):
            if step == a.warmup:
                title = f"decode, {n_seq} x {pos + step} tokens"
                profiled.enter_context(self._profiled(title, a.steps))
                graphs = self.graph_counts()
            if step == 0:  # the same token everywhere: every copy must give sequence 0's logits
                tokens = np.full(n_seq, self.rng.integers(0, self.n_vocab), np.int32)
            else:
                tokens = self.rng.integers(0, self.n_vocab, n_seq, dtype=np.int32)
            self._set(tokens, np.full(n_seq, pos + step, np.int32), seqs, True)
            t0 = time.perf_counter()
            self._decode()
            launched = time.perf_counter() - t0
            self.L.llama_synchronize(self.ctx)
            dt = time.perf_counter() - t0
            if step == 0 and self.samplers:  # no logits came back: the drawn tokens
                from pyqsa import native

                drawn = [native.sampled_get(self.ctx, i, -1).token for i in range(n_seq)]
                check = {"drawn_in_vocab": all(0 <= t < self.n_vocab for t in drawn)}
                if fresh_copies:
                    check["copy_tokens_equal"] = len(set(drawn)) == 1
            elif step == 0:
                lg = self.logits(n_seq)
                check = {
                    "logits_finite": bool(np.isfinite(lg).all()),
                    "logits_absmax": float(np.abs(lg).max()),
                }
                if fresh_copies:
                    check["copy_max_abs_diff"] = float(np.abs(lg - lg[0]).max())
            elif step >= a.warmup:
                times.append(dt)
                launches.append(launched)
        profiled.close()
        # per timed step: on CUDA a step that replays its captured graph is the fast path
        after = self.graph_counts()
        graphs = {k: round((after[k] - graphs[k]) / a.steps, 3) for k in after}
        med = statistics.median(times)
        return {
            "pos_start": pos,
            "steps": a.steps,
            "warmup": a.warmup,
            "step_ms_median": med * 1e3,
            "step_ms_min": min(times) * 1e3,
            "step_ms_max": max(times) * 1e3,
            "step_ms": [round(t * 1e3, 3) for t in times],
            "tok_s": n_seq / med,
            # until llama_decode returned: the host's part before the pass runs on its own (the
            # device idles through it but for its input copies)
            "launch_ms_median": statistics.median(launches) * 1e3,
            "graphs_per_step": graphs,
            **check,
        }
