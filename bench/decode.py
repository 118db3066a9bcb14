"""Decode and prefill throughput of a GGUF through llama.cpp's C API (llama_cpp bindings).

    python bench/decode.py model.gguf --variant pyqsa --contexts 8192,32768 --seqs 1,8 \
        --out results.jsonl [--lib DIR]

One llama context per context length C: n_seq_max = max(--seqs) sequences, a KV stream of C
cells per sequence (kv_unified off, n_ctx = C * n_seq_max), flash attention on, f16 K/V, all
layers offloaded when the build can. Sequence 0 is prefilled with random tokens in batches of
--ubatch (timed: the `prefill` record) up to C minus the decode steps still to come, after
--prefill-warmup untimed batches that are then removed again (llama-bench warms up likewise: a
context's first batch also pays one-time costs, kernel loading and buffer growth, which are not
throughput and which a server pays at start), so every
decode step runs between C - (warmup + steps) * len(seqs) and C (`pos_start` says where).
For each sequence count n (ascending) sequences 1..n-1 become copies of sequence 0
(llama_memory_seq_cp: one long prefill serves every n), then --warmup + --steps decode steps
run, each one token for every one of the n sequences in one llama_decode with logits for all of
them (timed up to llama_synchronize: the `decode` record). A step touches only the KV streams of
the sequences in its batch, so one context serves all sequence counts at the cost of one.

--profile PATH makes a profiling run instead: the last PROFILE_CHUNKS prefill batches and each
sequence count's timed steps run under the CUDA kernel profiler (bench/kernels.py), whose tables
(kernel time by name, per batch or step) are appended to PATH; it writes no timing records.

--lib picks the shared-library folder (LLAMA_CPP_LIB_PATH), so one script drives pyqsa's build
and an unpatched upstream build; the records say which one ran (pyqsa's library exports
pyqsa_version, upstream's does not) and refuse a --variant that disagrees.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import KernelProfile, require_kernel_profiler, table  # noqa: E402
from meta import run_meta  # noqa: E402

from pyqsa.engine.context import ContextConfig, ContextError, load_model, open_context  # noqa: E402

PREFILL_EXPONENT = 2.0  # prefill time grows at most quadratically with context (budget guess)
RESULTS = Path(__file__).resolve().parent / "results"  # report.py's files, earlier calls' records
RUN_MARGIN_S = 30.0  # what a run needs besides its prefill: model load, context, decode steps
PROFILE_CHUNKS = 2  # prefill batches a --profile run records (the last ones: the longest context)
# model files this close in size have the same tensors: metadata moves a file by a few bytes of
# padding (--locality's longer general.name: 32 bytes at the full shape)
SAME_MODEL_BYTES = 1 << 20


class BenchError(RuntimeError):
    pass


def _ints(s: str) -> list[int]:
    return sorted({int(x) for x in s.split(",") if x.strip()})


def decode_tokens(args: argparse.Namespace) -> int:
    """Positions the decode runs of one context take after its prefill."""
    return (args.warmup + args.steps) * len(args.seqs) * args.repeats


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--variant", choices=["pyqsa", "upstream"], required=True)
    ap.add_argument("--lib", type=Path, help="folder with libllama.so (default: the package's)")
    ap.add_argument("--contexts", type=_ints, default=[8192, 32768, 131072, 262144])
    ap.add_argument("--seqs", type=_ints, default=[1, 8])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="decode runs per sequence count after one prefill, each its own record (report.py "
        "shows their median and spread)",
    )
    ap.add_argument("--ubatch", type=int, default=512, help="prefill batch (n_batch = n_ubatch)")
    ap.add_argument(
        "--prefill-warmup",
        type=int,
        default=1,
        help="untimed prefill batches into sequence 0 before the timed prefill, then removed "
        "(the `prefill` record's warmup_batches; records without it had none)",
    )
    ap.add_argument("--gpu-layers", type=int, default=999, help="ignored by CPU-only builds")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    # NOTE: the pinned CPU backend's AMX f16 matmul crashes on batches over 5 streams; CPU
    # checks turn its weight repacking (an "extra buffer type") off
    ap.add_argument("--no-extra-bufts", action="store_true", help="no CPU weight repacking")
    ap.add_argument(
        "--qsa-mode",
        choices=["positional", "sparse", "masked"],
        default="positional",
        help="pyqsa's QSA path (sparse, masked: upstream's per-step pooling, for comparison)",
    )
    ap.add_argument(
        "--hot-blocks",
        type=int,
        default=0,
        help="pyqsa: page the QSA layers' K/V to pinned host memory with this many hot blocks "
        "per sequence and layer on the device (0: no paging)",
    )
    ap.add_argument(
        "--kv-type",
        choices=["f16", "q8_0"],
        default="f16",
        help="K/V type of the QSA layers; q8_0 only with --hot-blocks (the host store and hot "
        "cache in q8_0: half the bytes each miss brings), reported as variant pyqsa-paged-q8",
    )
    ap.add_argument(
        "--kv-hot-type",
        choices=["f16"],
        default=None,
        help="with --kv-type q8_0: an f16 hot cache over the q8_0 host store (each fetched block "
        "dequantized), reported as variant pyqsa-paged-q8f16",
    )
    ap.add_argument(
        "--sampling",
        choices=["host", "device"],
        default="host",
        help="host: every step copies each sequence's logits row to the host (as the server's "
        "--sampling host; the numpy draw itself is not timed); device (pyqsa): each row is drawn "
        "inside the step by the sample op at temperature 1 and only the token comes back",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--profile",
        type=Path,
        help="a profiling run: kernel time by name of the last prefill batches and the timed "
        "decode steps, appended to this file (needs PyTorch with CUDA); no timing records",
    )
    ap.add_argument(
        "--out",
        type=Path,
        action="append",
        default=[],
        help="append JSON lines here (repeatable); earlier lines feed --deadline",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="unix time: skip a context whose estimated run would end later",
    )
    args = ap.parse_args(argv)
    if args.hot_blocks and args.variant != "pyqsa":
        ap.error("--hot-blocks needs --variant pyqsa (upstream has no paging)")
    if args.sampling == "device" and (args.variant != "pyqsa" or args.hot_blocks):
        ap.error("--sampling device needs --variant pyqsa without --hot-blocks")
    if args.kv_type != "f16" and not args.hot_blocks:
        ap.error("--kv-type q8_0 needs --hot-blocks (one thing compared at a time)")
    if args.kv_hot_type and args.kv_type != "q8_0":
        ap.error("--kv-hot-type f16 needs --kv-type q8_0 (and so --hot-blocks)")
    if args.prefill_warmup < 0:
        ap.error("--prefill-warmup must be >= 0")
    if args.steps < 1 or args.warmup < 1 or args.repeats < 1:
        ap.error(
            "--steps, --warmup and --repeats must be >= 1 (a first warmup step checks the copies)"
        )
    room = min(args.contexts) - decode_tokens(args)
    if room < args.ubatch // 4:
        ap.error(f"context {min(args.contexts)} leaves only {room} tokens to prefill")
    return args


def _hit_rate(after: tuple[int, int], before: tuple[int, int]) -> float | None:
    """Hits / (hits + misses) between two (hits, misses) readings."""
    hits, misses = after[0] - before[0], after[1] - before[1]
    return hits / (hits + misses) if hits + misses else None


class Emitter:
    """Writes each record as one JSON line to stdout and every --out file, flushed at once
    (a run killed at its time limit keeps what it measured)."""

    def __init__(
        self, outs: list[Path], common: dict[str, Any], known: Sequence[dict[str, Any]] = ()
    ) -> None:
        self.outs, self.common = outs, common
        self.history: list[dict[str, Any]] = list(known)
        for p in outs:
            if p.exists():
                self.history += [json.loads(line) for line in p.read_text().splitlines() if line]

    def __call__(self, rec: dict[str, Any]) -> None:
        line = json.dumps({**rec, **self.common})
        print(line, flush=True)
        for p in self.outs:
            with open(p, "a") as f:
                f.write(line + "\n")
        self.history.append(json.loads(line))

    def estimate_s(self, variant: str, context: int) -> float | None:
        """Prefill seconds for `context` from this variant's measured prefills: the one at
        `context` itself, else the nearest larger one scaled down linearly, else the largest
        smaller one scaled up quadratically (both err long)."""
        done = [
            r for r in self.history if r.get("kind") == "prefill" and r.get("variant") == variant
        ]
        larger = [r for r in done if r["context"] >= context]
        if larger:
            r = min(larger, key=lambda r: r["context"])
            return r["seconds"] * context / r["context"]
        if not done:
            return None
        r = max(done, key=lambda r: r["context"])
        return r["seconds"] * (context / r["context"]) ** PREFILL_EXPONENT


def known_prefills(meta: dict[str, Any], n_batch: int) -> list[dict[str, Any]]:
    """Prefill records of bench/results/ from the same GPU and a model of the same size (up to
    SAME_MODEL_BYTES) at this prefill batch or a smaller one (no faster: its times bound this
    batch's from above): what earlier calls measured, so a new call's budget guesses start from
    it rather than from a quadratic scale-up of a short context. Size, not name: a synthetic
    model's name follows its generator's source (gpu_run.sh), while its shapes decide both its
    bytes and its cost, which synth_model.py --locality's model shares with the default one."""
    out = []
    for path in sorted(RESULTS.glob("*-decode.json")):
        for r in json.loads(path.read_text()).get("records", []):
            if (
                r.get("kind") == "prefill"
                and r.get("gpu") == meta.get("gpu")
                and abs(r.get("model_bytes", -SAME_MODEL_BYTES) - meta["model_bytes"])
                < SAME_MODEL_BYTES
                and r.get("flags", {}).get("n_batch", n_batch + 1) <= n_batch
            ):
                out.append(r)
    return out


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
        times, check = [], {}
        profiled = contextlib.ExitStack()
        for step in range(a.warmup + a.steps):
            if step == a.warmup:
                title = f"decode, {n_seq} x {pos + step} tokens"
                profiled.enter_context(self._profiled(title, a.steps))
            if step == 0:  # the same token everywhere: every copy must give sequence 0's logits
                tokens = np.full(n_seq, self.rng.integers(0, self.n_vocab), np.int32)
            else:
                tokens = self.rng.integers(0, self.n_vocab, n_seq, dtype=np.int32)
            self._set(tokens, np.full(n_seq, pos + step, np.int32), seqs, True)
            t0 = time.perf_counter()
            self._decode()
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
        profiled.close()
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
            **check,
        }


# the library's switch variables that restore upstream's (or an earlier pyqsa) way for one kind of
# op, and the suffix a run under one gets on its variant
UPSTREAM_SWITCHES = {
    "PYQSA_CUDA_MOE_SYNC": "-moesync",  # MoE products host-sorted past 128-512 tokens
    "PYQSA_CUDA_F16_ACCUMULATE": "-f16acc",  # f16 products on cuBLAS summed in f16
    "PYQSA_CUDA_GDN_UPSTREAM": "-gdnup",  # the gated delta rule on upstream's kernel
    "PYQSA_CUDA_MOE_MMF": "-moemmf",  # MoE products of every batch on MMF, no grouped GEMM
}


def library_switch_on(name: str) -> bool:
    """As the library reads a switch variable (native/ggml/cuda/pyqsa-cuda.cu): on when set to
    anything but "" or "0"."""
    return os.environ.get(name, "") not in ("", "0")


def run(args: argparse.Namespace) -> int:
    import llama_cpp as L

    if args.profile:
        try:
            require_kernel_profiler()
        except RuntimeError as e:
            raise BenchError(f"--profile: {e}") from None

    meta = run_meta(L, args.variant, args.lib, args.model)
    if args.hot_blocks:  # pyqsa's library with paging: reported as a variant of its own
        meta["variant"] = {"f16": "pyqsa-paged", "q8_0": "pyqsa-paged-q8"}[args.kv_type]
        meta["variant"] += "f16" if args.kv_hot_type else ""
    if args.sampling == "device":  # (only unpaged runs: one thing compared at a time)
        meta["variant"] = "pyqsa-sampled"
    if args.variant == "pyqsa" and os.environ.get("PYQSA_QSA_ATTN_MMA") == "0":
        # the library keeps qsa_attn's prefill on CUDA cores (no tensor-core kernel)
        meta["variant"] += "-cores"
    for name, suffix in UPSTREAM_SWITCHES.items():
        if args.variant == "pyqsa" and library_switch_on(name):
            meta["variant"] += suffix
    if args.profile:  # its records, printed only, say so: the profiler slows the steps
        meta["profiled"] = True
    emit = Emitter([] if args.profile else args.out, meta, known_prefills(meta, args.ubatch))
    bench = Bench(L, args.model, args)
    n_seq = max(args.seqs)
    for context in args.contexts:
        est = emit.estimate_s(meta["variant"], context)
        late = est is not None and time.time() + est + RUN_MARGIN_S > (args.deadline or 1e18)
        if late:
            emit(
                {
                    "kind": "skipped",
                    "context": context,
                    "reason": "deadline",
                    "estimated_prefill_s": round(est, 1),
                }
            )
            continue
        flags = bench.open(context, n_seq)
        try:
            n_fill = context - decode_tokens(args)
            secs = bench.prefill(n_fill)
            emit(
                {
                    "kind": "prefill",
                    "context": context,
                    "tokens": n_fill,
                    "seconds": secs,
                    "tok_s": n_fill / secs,
                    "warmup_batches": args.prefill_warmup,
                    "model_load_s": bench.load_s,
                    "flags": flags,
                    **bench.ledger(),
                }
            )
            for n in args.seqs:
                pos = bench.copy_seq0(n)
                for repeat in range(args.repeats):
                    before = bench.ledger().get("paging")
                    rec = bench.decode(n, pos, fresh_copies=repeat == 0)
                    pos += args.warmup + args.steps
                    after = bench.ledger().get("paging")
                    if before and after:  # per decode step, warmup included
                        n_steps = args.warmup + args.steps
                        rec["paging_per_step"] = {
                            k: (after[k] - before[k]) / n_steps
                            for k in after
                            if k not in ("hot_blocks", "layers")
                        }
                        rec["hit_rate_per_layer"] = {
                            il: _hit_rate(after["layers"][il], before["layers"][il])
                            for il in after["layers"]
                        }
                    emit(
                        {
                            "kind": "decode",
                            "context": context,
                            "n_seq": n,
                            "repeat": repeat,
                            "flags": flags,
                            **rec,
                        }
                    )
        finally:
            bench.close()
    if args.profile:
        keys = ("commit", "variant", "gpu", "model")
        head = "# " + ", ".join(f"{k} {meta.get(k)}" for k in keys) + f"; ubatch {args.ubatch}"
        text = "\n\n".join([head, *bench.profiles]) + "\n\n"
        with open(args.profile, "a") as f:  # a call's variants share one file
            f.write(text)
        print(text, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.lib is not None:
        if not (args.lib / "libllama.so").exists():
            raise SystemExit(f"{args.lib}: no libllama.so there")
        # read by the bindings when they load the library, i.e. at import
        os.environ["LLAMA_CPP_LIB_PATH"] = str(args.lib.resolve())
    try:
        return run(args)
    except BenchError as e:
        print(f"decode.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
