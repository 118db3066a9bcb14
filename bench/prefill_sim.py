"""Prefill policies in simulation: pyqsa's real Scheduler, llama.cpp's batch splitting, H200 costs.

No model runs: each step's chunks are split into ubatches as llama_decode would split them
(`split_equal`, a mirror of upstream's `llama_batch_allocr::split_equal` for one KV stream per
sequence), and each ubatch costs the time the H200 took for that shape with the full-shape
synthetic model (the H200 figures below, DECODE_1_S, DECODE_8_S and PREFILL_TOKENS_S): at least
one decode pass, or its tokens at the prefill rate. The figures are a model for comparing
policies, not a benchmark.

    python bench/prefill_sim.py            # the serving workloads, both policies
    python bench/prefill_sim.py --paged    # long prompts with host-backed KV paging
    python bench/prefill_sim.py --prefill-batch-tokens 2048   # the server benchmarks' larger steps

With --paged each prompt chunk also stages, in each of the 12 QSA layers, the history blocks its
queries select from host memory: a share 1 - (1 - 2048 / history) ** chunk of the history's K/V
(random selections, the synthetic model's worst case; a real model's local selections share
more) at 33 GB/s (the H200's staged rate, 16.2 ms a layer for a 512-token chunk at 256K).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyqsa.engine import SamplingParams
from pyqsa.engine.request import Request
from pyqsa.engine.scheduler import PREFILL_POLICIES, Scheduler
from pyqsa.engine.slots import SlotTable

DECODE_1_S = 1 / 105.9  # one sequence's decode step (bench/decode.py, 8K)
DECODE_8_S = 1 / 425.5 * 8  # eight sequences' decode step
PREFILL_TOKENS_S = 3500.0  # prefill rate at every length, server and bench


def split_equal(batch: Sequence[tuple[int, int]], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """The ubatches llama_decode makes of `batch` ((seq_id, n_tokens) chunks in batch order,
    one per sequence) with kv_unified off: split_equal(sequential=true, n_keep_tail=0). Each
    ubatch takes the same number of tokens from a run of consecutive seq ids, met in batch
    order; that number is the smallest remainder among them (and fits n_ubatch)."""
    left = dict(batch)
    ubatches = []
    while any(left.values()):
        seqs: list[int] = []
        for seq, _ in batch:
            if left[seq] and (not seqs or seq == seqs[-1] + 1):
                seqs.append(seq)
        n = min(min(left[s] for s in seqs), max(1, n_ubatch // len(seqs)))
        for s in seqs:
            left[s] -= n
        ubatches.append([(s, n) for s in seqs])
    return ubatches


STAGE_BYTES_S = 33e9  # host K/V staged for paged prefill (bench/README.md, 8f8e313)
QSA_LAYERS = 12
CELL_BYTES = 2 * 2 * 256 * 2  # K and V, 2 KV heads of 256 f16
SELECTED = 2048  # cells one query selects


def stage_seconds(chunk: int, history: int) -> float:
    """--paged: the staging of one prompt chunk of `chunk` tokens after `history` tokens."""
    if history == 0:
        return 0.0
    share = 1.0 - (1.0 - min(1.0, SELECTED / history)) ** chunk
    return QSA_LAYERS * share * history * CELL_BYTES / STAGE_BYTES_S


def ubatch_seconds(ubatch: list[tuple[int, int]]) -> float:
    """A pass costs at least a decode step of as many sequences, or its tokens at the prefill
    rate (decode step times interpolated between 1 and 8 sequences)."""
    n_seqs = len(ubatch)
    floor = DECODE_1_S + (DECODE_8_S - DECODE_1_S) * (min(n_seqs, 8) - 1) / 7
    return max(floor, sum(n for _, n in ubatch) / PREFILL_TOKENS_S)


@dataclass
class Arrival:
    at: float  # seconds
    prompt: int  # tokens
    output: int  # tokens to generate


@dataclass
class Result:
    policy: str
    ttft: list[float]  # seconds, per arrival
    done: list[float]  # seconds, per arrival: last token
    steps: int = 0
    ubatches: int = 0
    tokens: int = 0
    full_decode_steps: int = 0  # steps in which every slot decoded
    per_step_ubatches: list[int] = field(default_factory=list)


def simulate(
    arrivals: Sequence[Arrival],
    policy: str,
    n_slots: int = 8,
    batch_tokens: int = 512,
    paged: bool = False,
    long_turns: bool = False,
    prefill_tokens: int | None = None,
) -> Result:
    """Run the workload through a Scheduler until every request has its output (its larger
    steps of `prefill_tokens`, the server's --prefill-batch-tokens, in ubatches as large)."""
    sched = Scheduler(
        SlotTable(n_slots, 1 << 30, lambda slot: None),
        batch_tokens,
        policy,
        max_prefill_tokens=prefill_tokens,
        long_turns=long_turns,
    )
    n_ubatch = max(batch_tokens, prefill_tokens or 0)
    reqs = [
        Request(str(i), [1] * a.prompt, SamplingParams(), lambda ev: None, a.prompt + a.output)
        for i, a in enumerate(arrivals)
    ]
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].at)
    label = policy + ("+turns" if long_turns else "")
    res = Result(label, [0.0] * len(arrivals), [0.0] * len(arrivals))
    now, nxt = 0.0, 0
    while nxt < len(order) or sched.running or sched.waiting:
        while nxt < len(order) and arrivals[order[nxt]].at <= now:
            sched.add(reqs[order[nxt]])
            nxt += 1
        chunks = sched.schedule()
        if not chunks:
            now = arrivals[order[nxt]].at
            continue
        ubatches = split_equal([(c.lease.slot, len(c.tokens)) for c in chunks], n_ubatch)
        now += sum(ubatch_seconds(u) for u in ubatches)
        if paged:
            prompt_chunks = [c for c in chunks if c.start < len(c.request.prompt)]
            now += sum(stage_seconds(len(c.tokens), c.start) for c in prompt_chunks)
        res.steps += 1
        res.ubatches += len(ubatches)
        res.per_step_ubatches.append(len(ubatches))
        res.tokens += sum(len(c.tokens) for c in chunks)
        res.full_decode_steps += sum(len(c.tokens) == 1 for c in chunks) == n_slots
        for c in chunks:
            req, i = c.request, int(c.request.request_id)
            req.num_computed_tokens += len(c.tokens)
            if not c.sample:
                continue
            req.tokens.append(1)
            if req.num_output_tokens == 1:
                res.ttft[i] = now - arrivals[i].at
            if len(req.tokens) >= req.max_len:
                res.done[i] = now - arrivals[i].at
                sched.finish(req)
    return res


def workloads(seed: int) -> dict[str, list[Arrival]]:
    rng = random.Random(seed)
    mixed = []
    t = 0.0
    for _ in range(200):
        t += rng.expovariate(1.0)  # 1 request/s: ~2.3K prompt tokens/s of 3.5K
        mixed.append(Arrival(t, int(16 * 1000 ** rng.random()), rng.randint(1, 64)))
    return {
        "8 x 32K prompts, 192 out": [Arrival(0, 32000, 192) for _ in range(8)],
        "7 x 32K, then 64 tokens at 2 s": [Arrival(0, 32000, 192) for _ in range(7)]
        + [Arrival(2.0, 64, 16)],
        "8 x 32K (every slot), then 64 at 2 s": [Arrival(0, 32000, 192) for _ in range(8)]
        + [Arrival(2.0, 64, 16)],
        "7 x 4K, then 64 tokens at 0.1 s": [Arrival(0, 4000, 192) for _ in range(7)]
        + [Arrival(0.1, 64, 16)],
        "200 mixed (16-16K prompts, 1/s)": mixed,
    }


def report(name: str, arrivals: list[Arrival], res: Result) -> str:
    short = [t for a, t in zip(arrivals, res.ttft, strict=True) if a.prompt <= 256]
    long = [t for a, t in zip(arrivals, res.ttft, strict=True) if a.prompt > 256]

    def stats(xs: list[float]) -> str:
        if not xs:
            return "-"
        xs = sorted(xs)
        return f"{statistics.median(xs):6.2f} / {xs[int(0.99 * (len(xs) - 1))]:6.2f}"

    return (
        f"{name:34s} {res.policy:5s} | ttft <=256 tok {stats(short):>15s} | "
        f">256 tok {stats(long):>15s} | max {max(res.ttft):6.2f} | "
        f"end {max(a.at + d for a, d in zip(arrivals, res.done, strict=True)):7.2f} s | "
        f"ubatch/step {res.ubatches / res.steps:.2f} (max {max(res.per_step_ubatches)}) | "
        f"all-decode steps {res.full_decode_steps}"
    )


def paged_workloads() -> dict[str, list[Arrival]]:
    return {
        "8 x 64K prompts, 64 out": [Arrival(0, 65536, 64) for _ in range(8)],
        "8 x 256K prompts, 64 out": [Arrival(0, 262144, 64) for _ in range(8)],
        "7 x 64K, then 64 tokens at 2 s": [Arrival(0, 65536, 64) for _ in range(7)]
        + [Arrival(2.0, 64, 16)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument(
        "--prefill-batch-tokens", type=int, default=None, help="default: --batch-tokens"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--paged", action="store_true", help="add paged prefill's staging (above)")
    args = ap.parse_args()
    print("ttft: median / p99 seconds; end: last token of the workload")
    runs = [(p, False) for p in PREFILL_POLICIES] + ([("fair", True)] if args.paged else [])
    loads = paged_workloads() if args.paged else workloads(args.seed)
    for name, arrivals in loads.items():
        for policy, turns in runs:
            res = simulate(
                arrivals,
                policy,
                args.slots,
                args.batch_tokens,
                args.paged,
                turns,
                args.prefill_batch_tokens,
            )
            print(report(name, arrivals, res))
            if len(arrivals) <= 8:
                print(f"{'':34s}       first tokens at {[round(t, 1) for t in res.ttft]}")


if __name__ == "__main__":
    main()
