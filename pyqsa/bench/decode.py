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
sequence count's timed steps run under the CUDA kernel profiler (pyqsa.bench.kernels), whose tables
(kernel time by name, per batch or step) are appended to PATH; it writes no timing records.

--lib picks the shared-library folder (LLAMA_CPP_LIB_PATH), so one script drives pyqsa's build
and an unpatched upstream build; the records say which one ran (pyqsa's library exports
pyqsa_version, upstream's does not) and refuse a --variant that disagrees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .decode_bench import Bench, BenchError
from .kernels import require_kernel_profiler
from .meta import RESULTS, run_meta
from .weight_floor import floor_ms, step_weights

PREFILL_EXPONENT = 2.0  # prefill time grows at most quadratically with context (budget guess)
RUN_MARGIN_S = 30.0  # what a run needs besides its prefill: model load, context, decode steps
# model files this close in size have the same tensors: metadata moves a file by a few bytes of
# padding (--locality's longer general.name: 32 bytes at the full shape)
SAME_MODEL_BYTES = 1 << 20


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
        help="decode runs per sequence count after one prefill, each its own record "
        "(bench/report.py shows their median and spread)",
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
    """Prefill records of bench/results/ (every file that keeps decode.py's records: decode,
    steps, quant) from the same GPU and a model of the same size (up to SAME_MODEL_BYTES) at
    this prefill batch or a smaller one (no faster: its times bound this batch's from above):
    what earlier calls measured, so a new call's budget guesses start from it rather than from a
    quadratic scale-up of a short context (which made 256K's 34 s 256 s and skipped it). Size,
    not name: a synthetic model's name follows its generator's source (gpu_run.sh), while its
    shapes decide both its bytes and its cost, which synth_model.py --locality's model shares
    with the default one; a quantized file's bytes are its own."""
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        for r in doc.get("records", []) if isinstance(doc, dict) else []:
            if (
                r.get("kind") == "prefill"
                and r.get("gpu") == meta.get("gpu")
                and abs(r.get("model_bytes", -SAME_MODEL_BYTES) - meta["model_bytes"])
                < SAME_MODEL_BYTES
                and r.get("flags", {}).get("n_batch", n_batch + 1) <= n_batch
            ):
                out.append(r)
    return out


# the library's switch variables that restore upstream's (or an earlier pyqsa) way for one kind of
# op, and the suffix a run under one gets on its variant
UPSTREAM_SWITCHES = {
    "PYQSA_CUDA_MOE_SYNC": "-moesync",  # MoE products host-sorted past 128-512 tokens
    "PYQSA_CUDA_F16_ACCUMULATE": "-f16acc",  # f16 products on cuBLAS and MMVF summed in f16
    "PYQSA_CUDA_GDN_UPSTREAM": "-gdnup",  # the gated delta rule on upstream's kernel
    "PYQSA_CUDA_MOE_MMF": "-moemmf",  # MoE products of every batch on MMF, no grouped GEMM
    "PYQSA_CUDA_GEMV_UPSTREAM": "-gemvup",  # decode products (1-8 columns) on MMVF/MMF
    "PYQSA_HC_UNFUSED": "-hcunf",  # the hyper-connection combine and gate as upstream's ops
    "PYQSA_CUDA_PRODUCTS_UNGROUPED": "-ungrp",  # a decode step's products of one x a launch each
    "PYQSA_GATES_UNFUSED": "-gatesunf",  # the linear attention's and shared expert's gates unfused
    "PYQSA_CUDA_TOPK_ONE_CTA": "-topk1",  # a decode step's top-k rows on one CTA each, no cluster
    "PYQSA_HC_MIX_UNFUSED": "-hcmixunf",  # a decode step's hyper-connection mixes as upstream's ops
    "PYQSA_CUDA_HC_COMBINE_APART": "-combapart",  # each hyper-connection combine a launch apart
    "PYQSA_HC_JOIN_UNFUSED": "-joinunf",  # the MoE's gated join an op apart from the combine
    "PYQSA_HC_MIX_TOKENS": "-mix8",  # hyper-connection mixes fused at steps of up to 8 tokens
    "PYQSA_CUDA_GDN_CONV_APART": "-gdnconvapart",  # a decode step's gates a launch apart
    "PYQSA_SCHED_INPUTS_SYNC": "-inputsync",  # each host input copied with upstream's waits
    "PYQSA_CUDA_GEMV_ONE_CHUNK": "-chunk1",  # q4_K/q5_K/q6_K decode products one chunk a step
}


# the switches that turn off the decode fast path together (pyqsa's decode products, their
# grouping, the fused hyper-connection, gate and mix ops, the staged inputs, the top-k cluster): a
# run with every one on is the variant `pyqsa-fastoff`, the step with pyqsa's sparse attention and
# paging but upstream's decode path otherwise
FAST_PATH_OFF = (
    "PYQSA_CUDA_GEMV_UPSTREAM",
    "PYQSA_CUDA_PRODUCTS_UNGROUPED",
    "PYQSA_HC_UNFUSED",
    "PYQSA_GATES_UNFUSED",
    "PYQSA_HC_MIX_UNFUSED",
    "PYQSA_CUDA_TOPK_ONE_CTA",
    "PYQSA_SCHED_INPUTS_SYNC",
)


def library_switch_on(name: str) -> bool:
    """As the library reads a switch variable (native/ggml/cuda/pyqsa-cuda.cu,
    native/src/fused-ops.cpp): on when set to anything but "" or "0"."""
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
        # the library keeps qsa_attn on CUDA cores (no tensor-core kernel)
        meta["variant"] += "-cores"
    if args.variant == "pyqsa":
        on = [name for name in UPSTREAM_SWITCHES if library_switch_on(name)]
        if set(FAST_PATH_OFF) <= set(on):
            meta["variant"] += "-fastoff"
            on = [name for name in on if name not in FAST_PATH_OFF]
        meta["variant"] += "".join(UPSTREAM_SWITCHES[name] for name in on)
    if args.profile:  # its records, printed only, say so: the profiler slows the steps
        meta["profiled"] = True
    emit = Emitter([] if args.profile else args.out, meta, known_prefills(meta, args.ubatch))
    floors = {n: step_weights(args.model, n) for n in args.seqs}
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
                            "weight_bytes": floors[n].total,
                            "weight_floor_ms": floor_ms(floors[n], meta.get("gpu")),
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
