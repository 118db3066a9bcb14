"""The mission load through a running `pyqsa serve`: eight ~255K-token completions at once, what
they cost, cancellations at full length, and whether everything came back to where it was right
after start. The steps of tests/gpu/mission.sh, one subcommand each, their state in files, so a
run can span several device calls (a server and a load outlive the call that started them):

    python bench/mission.py smi --pid PID --out smi.csv
        nvidia-smi every second until PID exits: the process's device memory (where nvidia-smi
        lists processes) and the GPU's
    python bench/mission.py baseline URL --smi smi.csv --log serve.log --out baseline.json
        right after start: the ledger, the paging counters, nvidia-smi, the start lines
    python bench/mission.py load URL --baseline baseline.json --smi smi.csv --out load.json \\
        --requests 8 --prompt-tokens 255000 --max-tokens 256 --cancel-checks
        the load (bench/serve_load.py's streamed completions): per request the time to first
        token and to the last; the window in which all decode together (its length, tokens/s,
        PCIe bytes per step); peak device memory by the ledger (/metrics, sampled) and by
        nvidia-smi; paging hits and PCIe bytes (/metrics deltas); then, with --cancel-checks, a
        prompt of the same length cancelled during its prefill and one during its decode
        (seconds and engine passes from the cancel until /metrics shows the slot free); last,
        the figures once everything ended against the baseline
    python bench/mission.py report --state DIR --decode decode.jsonl --results bench/results
        the paged and unpaged loads and bench/decode.py's paged step as one record,
        <date>-<commit>-mission.json

Every output is written whole or not at all (a temporary file renamed), so a waiting step sees
a result only once it is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx

from . import serve_load
from .meta import git_commit, gpu_name, source_digest
from .smi import smi_after, smi_changes, smi_peak, smi_sample, smi_source

GiB = 2**30
LEDGER = re.compile(r'^pyqsa_ledger_bytes\{category="([^"]+)"\}$')
PAGING = {
    "hits": "pyqsa_paging_hits_total",
    "misses": "pyqsa_paging_misses_total",
    "staged": "pyqsa_paging_staged_total",
    "to_device": 'pyqsa_paging_bytes_total{direction="to_device"}',
    "to_host": 'pyqsa_paging_bytes_total{direction="to_host"}',
}
STEPS = "pyqsa_engine_steps_total"
FORWARD = 'pyqsa_engine_step_seconds_total{part="forward"}'
PROMPT_TOKENS = "pyqsa_prompt_tokens_total"
LIMIT = "pyqsa_device_memory_limit_bytes"
IDLE = ("pyqsa_busy_slots", "pyqsa_requests_in_flight", "pyqsa_http_open_requests")
DECODE_TOKENS_BEFORE_CANCEL = 4  # the decode cancellation hangs up after this many tokens
PREFILL_SHARE_BEFORE_CANCEL = 0.25  # the prefill one once this share of its prompt is in
CANCEL_WAIT_S = 600.0  # a slot not free this long after a cancel is reported as never freed
# ggml's CUDA backend keeps an instantiated CUDA graph per graph shape until it has gone unused
# this long, checked only when a graph runs: an idle server keeps its last load's graphs
CUDA_GRAPH_EVICT_S = 10.0


def write_json(path: Path, record: dict[str, Any]) -> None:
    """`record` at `path`, whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)


def ledger(samples: dict[str, float]) -> dict[str, int]:
    """The ledger's categories ("device.hot", "host.kv", ...) from /metrics samples."""
    out = {}
    for name, value in samples.items():
        if m := LEDGER.match(name):
            out[m.group(1)] = int(value)
    return out


def device_bytes(samples: dict[str, float]) -> int:
    return sum(v for k, v in ledger(samples).items() if k.startswith("device."))


def paging(samples: dict[str, float]) -> dict[str, float] | None:
    """The paging counters; None where the server does not page."""
    if PAGING["hits"] not in samples:
        return None
    return {k: samples.get(name, 0.0) for k, name in PAGING.items()}


def gib(n: float | None) -> float | None:
    return None if n is None else round(n / GiB, 3)


# -- baseline and end state -----------------------------------------------------------------


def snapshot(url: str, smi: Path | None) -> dict[str, Any]:
    """What must come back once every request ended: the ledger (the host store, host.kv, and the
    pinned buffers among its host categories) and nvidia-smi's figure, with the paging counters."""
    now = time.time()
    samples = serve_load.scrape(url)
    return {
        "unix": now,
        "ledger": ledger(samples),
        "paging": paging(samples),
        "hot_blocks": samples.get("pyqsa_paging_hot_blocks"),
        "device_memory_limit_bytes": samples.get(LIMIT),
        "nvidia_smi_mib": smi_after(smi, now),
        "nvidia_smi_source": smi_source(smi),
    }


def compare(baseline: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """Which figures are back at their baseline values."""
    a, b = baseline["ledger"], end["ledger"]
    host = {k for k in a.keys() | b.keys() if k.startswith("host.")}
    checks = {
        "ledger": a == b,
        "host_store": a.get("host.kv") == b.get("host.kv"),
        "host_buffers": all(a.get(k) == b.get(k) for k in host),
        "nvidia_smi": baseline["nvidia_smi_mib"] == end["nvidia_smi_mib"],
    }
    changed = {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
    if not checks["nvidia_smi"]:  # the device memory outside the ledger, in MiB
        changed["nvidia_smi_mib"] = [baseline["nvidia_smi_mib"], end["nvidia_smi_mib"]]
    return {**checks, "all": all(checks.values()), "changed": changed}


def wait_idle(url: str, timeout: float = 120.0) -> dict[str, float]:
    """/metrics once no request is in flight (a cancelled one ends after its pass)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = serve_load.scrape(url)
        if all(samples.get(k) == 0 for k in IDLE) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def settled(url: str) -> dict[str, float]:
    """/metrics once the engine idles and has read the paging counters of its last passes (an
    idle engine reads them once due: up to PAGING_READ_INTERVAL_S after its last pass)."""
    from pyqsa.engine.engine import PAGING_READ_INTERVAL_S

    wait_idle(url)
    time.sleep(PAGING_READ_INTERVAL_S + 0.25)
    return serve_load.scrape(url)


def start_lines(log: Path | None) -> list[str]:
    """The server's own lines about its start (memory, paging, sampling)."""
    if log is None or not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if line.startswith("pyqsa: ")]


# -- the load -------------------------------------------------------------------------------


def prompts(n: int, tokens: int, seed: int) -> list[list[int]]:
    """`n` prompts of random token ids, each different (nothing is shared between requests)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 5000) for _ in range(tokens)] for _ in range(n)]


def attempt(url: str, model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """serve_load.one, with an HTTP failure recorded instead of raised."""
    t0 = time.perf_counter()
    try:
        return serve_load.one(url, model, prompt, max_tokens)
    except httpx.HTTPError as e:
        return {"t0": t0, "times": [], "completion_tokens": None, "error": repr(e)}


def in_window(snapshots: list[tuple[float, dict]], window: tuple[float, float] | None):
    """The first and last snapshots taken inside `window` (perf_counter times), or None."""
    if window is None:
        return None
    inside = [s for t, s in snapshots if window[0] <= t <= window[1]]
    return (inside[0], inside[-1]) if len(inside) >= 2 else None


def hit_rate(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    if a is None or b is None:
        return None
    hits, misses = b["hits"] - a["hits"], b["misses"] - a["misses"]
    return round(hits / (hits + misses), 4) if hits + misses else None


def decode_window(runs: list[dict], snapshots: list[tuple[float, dict]]) -> dict[str, Any]:
    """The window in which every request decoded: seconds, tokens/s, what paging did in it
    (paging counters are read at most once a second by the engine: up to a second of steps off
    at either end), and under "engine" where its steps went and how their graphs ran."""
    window = serve_load.together_window(runs)
    rate = serve_load.together_rate(runs)
    out: dict[str, Any] = {
        "seconds": round(window[1] - window[0], 3) if window else None,
        "tokens_per_s": round(rate, 2) if rate is not None else None,
        "steps": None,
        "to_device_per_step": None,
        "hit_rate": None,
        "engine": None,
    }
    ends = in_window(snapshots, window)
    if ends is None:
        return out
    a, b = ends
    steps = b.get(STEPS, 0) - a.get(STEPS, 0)
    out["steps"] = int(steps)
    pa, pb = paging(a), paging(b)
    if steps and pa is not None and pb is not None:
        out["to_device_per_step"] = round((pb["to_device"] - pa["to_device"]) / steps)
        out["hit_rate"] = hit_rate(pa, pb)
    # where the steps went (forward, host, launch ms a step), to set against bench/decode.py's
    # step, and how their graphs ran
    out["engine"] = serve_load.engine_between(serve_load.engine_of(a), serve_load.engine_of(b))
    return out


@dataclass(frozen=True)
class LongLoad:
    """The load of the `load` subcommand (its options say what each field is)."""

    url: str
    requests: int = 8
    prompt_tokens: int = 255000
    max_tokens: int = 256
    seed: int = 0
    serve_flags: str = ""
    cancel_checks: bool = False
    cancel_prompt_tokens: int | None = None
    poll: float = 0.5
    cancel_poll: float = 0.05
    progress_every: float = 30.0


def print_progress(seconds: float, prompt_in: float, total: int, busy: float) -> None:
    print(
        f"load: {seconds:.0f} s, prompt tokens {prompt_in:.0f} of {total}, busy slots {busy:.0f}",
        flush=True,
    )


Progress = Callable[[float, float, int, float], None]


def run_load(args: LongLoad, model: str, progress: Progress = print_progress) -> dict[str, Any]:
    """The concurrent requests and their figures; `progress(seconds, prompt tokens in, of all,
    busy slots)` every `progress_every` seconds."""
    url = args.url
    batch = prompts(args.requests, args.prompt_tokens, args.seed)
    before = serve_load.scrape(url)
    unix0, perf0 = time.time(), time.perf_counter()
    with serve_load.CounterPoller(url, every=args.poll, read=serve_load.scrape) as poller:
        with ThreadPoolExecutor(args.requests) as pool:
            futures = [pool.submit(attempt, url, model, p, args.max_tokens) for p in batch]
            while wait(futures, timeout=args.progress_every).not_done:
                if poller.snapshots:
                    s = poller.snapshots[-1][1]
                    progress(
                        time.perf_counter() - perf0,
                        s.get(PROMPT_TOKENS, 0) - before.get(PROMPT_TOKENS, 0),
                        args.requests * args.prompt_tokens,
                        s.get("pyqsa_busy_slots", 0),
                    )
            runs = [f.result() for f in futures]
    wall = time.perf_counter() - perf0
    after = settled(url)

    def since_start(r: dict, i: int) -> float | None:
        return round(r["times"][i] - r["t0"], 3) if r["times"] else None

    pa, pb = paging(before), paging(after)
    ledger_peak = max((device_bytes(s) for _, s in poller.snapshots), default=None)
    return {
        "answered": sum(bool(r["times"]) for r in runs),
        "errors": [r["error"] for r in runs if "error" in r],
        "wall_s": round(wall, 2),
        "ttft_s": [since_start(r, 0) for r in runs],
        "finish_s": [since_start(r, -1) for r in runs],
        "completion_tokens": [r["completion_tokens"] for r in runs],
        "decode_window": decode_window(runs, poller.snapshots),
        "hit_rate": hit_rate(pa, pb),
        "pcie_bytes": None
        if pa is None or pb is None
        else {k: int(pb[k] - pa[k]) for k in ("to_device", "to_host")},
        "staged_blocks": None if pa is None or pb is None else int(pb["staged"] - pa["staged"]),
        "peak_ledger_device_bytes": ledger_peak,
        "unix_start": unix0,
    }


# -- cancellation ---------------------------------------------------------------------------


async def _scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    return serve_load.parse_metrics((await client.get(f"{url}/metrics")).text)


async def cancel_check(url: str, model: str, prompt: list[int], when: str, poll: float) -> dict:
    """A request cancelled (its client hangs up) during its prefill, once a quarter of its prompt
    is in, or during its decode, after a few tokens: the seconds and the engine passes from the
    hang-up until /metrics shows its slot free. A pass in flight runs to its end (on CUDA
    llama.cpp does not abort a graph), so one pass after the cancel is the bound."""
    tokens: list[float] = []
    body = serve_load.completion_body(model, prompt, 4096)

    async with httpx.AsyncClient(timeout=None) as client:

        async def stream() -> None:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    event = serve_load.stream_event(line)
                    if event is not None and event[0]:
                        tokens.append(time.perf_counter())

        start = await _scrape(client, url)
        task = asyncio.create_task(stream())
        history: list[tuple[float, dict[str, float]]] = []
        while not task.done():
            s = await _scrape(client, url)
            history.append((time.perf_counter(), s))
            prompt_in = s.get(PROMPT_TOKENS, 0) - start.get(PROMPT_TOKENS, 0)
            if when == "prefill" and prompt_in >= PREFILL_SHARE_BEFORE_CANCEL * len(prompt):
                break
            if when == "decode" and len(tokens) >= DECODE_TOKENS_BEFORE_CANCEL:
                break
            await asyncio.sleep(poll)
        if task.done():  # it ended (or failed) before the moment came: nothing to cancel
            error = task.exception()
            return {"when": when, "cancelled_in": None, "error": repr(error) if error else None}
        last = await _scrape(client, url)  # right before the hang-up
        cancelled = time.perf_counter()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        # NOTE: passes are counted from here: one that ended between `last` and the hang-up
        # is not one after it
        hung_up = await _scrape(client, url)
        while True:
            s = await _scrape(client, url)
            freed = time.perf_counter()
            if all(s.get(k) == 0 for k in IDLE[:2]) or freed - cancelled > CANCEL_WAIT_S:
                break
            await asyncio.sleep(poll)
    prompt_in = last.get(PROMPT_TOKENS, 0) - start.get(PROMPT_TOKENS, 0)
    passes = s.get(STEPS, 0) - hung_up.get(STEPS, 0)
    # the passes' mean length over the request's last few seconds before the hang-up
    recent = [h for t, h in history if t >= cancelled - 5.0] + [last]
    steps = recent[-1].get(STEPS, 0) - recent[0].get(STEPS, 0)
    pass_s = (recent[-1].get(FORWARD, 0) - recent[0].get(FORWARD, 0)) / steps if steps else None
    free = all(s.get(k) == 0 for k in IDLE[:2])
    return {
        "when": when,
        "cancelled_in": "prefill" if prompt_in < len(prompt) and not tokens else "decode",
        "prompt_tokens_in": int(prompt_in),
        "tokens_received": len(tokens),
        "freed": free,
        "free_s": round(freed - cancelled, 3) if free else None,
        "passes_after_cancel": int(passes),
        "pass_s": round(pass_s, 3) if pass_s is not None else None,
        "within_one_pass": free and passes <= 1,
    }


# -- subcommands ----------------------------------------------------------------------------


def cmd_smi(args: argparse.Namespace) -> int:
    smi_sample(args.pid, args.out, args.every)
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    record = snapshot(args.url, args.smi)
    record["start_lines"] = start_lines(args.log)
    write_json(args.out, record)
    print(json.dumps({k: record[k] for k in ("ledger", "hot_blocks", "nvidia_smi_mib")}))
    return 0


def load_record(
    load: LongLoad,
    baseline: dict[str, Any],
    smi: Path | None,
    progress: Progress = print_progress,
) -> dict[str, Any]:
    """The load, then with `cancel_checks` the cancellations, then the end state against
    `baseline` (a `snapshot` right after the server started)."""
    model = httpx.get(f"{load.url}/v1/models").json()["data"][0]["id"]
    record: dict[str, Any] = {
        "kind": "load",
        "serve_flags": load.serve_flags,
        "requests": load.requests,
        "prompt_tokens": load.prompt_tokens,
        "max_tokens": load.max_tokens,
        **run_load(load, model, progress),
    }
    print(f"load: done in {record['wall_s']} s, {record['answered']} answered", flush=True)
    if load.cancel_checks:
        n = load.cancel_prompt_tokens or load.prompt_tokens
        cancel_prompt = prompts(1, n, load.seed + 1)[0]
        record["cancel_prompt_tokens"] = n
        record["cancel"] = [
            asyncio.run(cancel_check(load.url, model, cancel_prompt, when, load.cancel_poll))
            for when in ("prefill", "decode")
        ]
        print(f"load: cancellations {json.dumps(record['cancel'])}", flush=True)
    wait_idle(load.url)
    end = snapshot(load.url, smi)
    record["baseline"] = baseline
    record["end"] = end
    record["back_to_baseline"] = compare(baseline, end)
    record["peak_nvidia_smi_mib"] = smi_peak(smi, since=0.0)  # over the server's life
    record["nvidia_smi_changes"] = smi_changes(smi, baseline["unix"], end["unix"])
    print(f"load: back to baseline {json.dumps(record['back_to_baseline'])}", flush=True)
    if not record["back_to_baseline"]["nvidia_smi"]:
        record["after_probe"] = idle_probe(load.url, model, smi)
        print(f"load: after an idle probe {json.dumps(record['after_probe'])}", flush=True)
    return record


def idle_probe(url: str, model: str, smi: Path | None) -> dict[str, Any]:
    """nvidia-smi and the ledger after the server idled past the CUDA graphs' eviction age and then
    ran one short request: what the load left that the backend's own caches give back (its graph
    instances) against what stays."""
    time.sleep(CUDA_GRAPH_EVICT_S + 1.0)
    attempt(url, model, prompts(1, 16, seed=7)[0], 1)
    wait_idle(url)
    time.sleep(1.5)  # nvidia-smi is sampled every second
    now = snapshot(url, smi)
    return {
        "nvidia_smi_mib": now["nvidia_smi_mib"],
        "device_pool": now["ledger"].get("device.pool"),
    }


def cmd_load(args: argparse.Namespace) -> int:
    load = LongLoad(**{f.name: getattr(args, f.name) for f in fields(LongLoad)})
    record = load_record(load, json.loads(args.baseline.read_text()), args.smi)
    write_json(args.out, record)
    return 0


def decode_py_rate(path: Path | None) -> float | None:
    """bench/decode.py's paged decode rate at 8 sequences (the median over its repeats)."""
    if path is None or not path.exists():
        return None
    rates = [
        r["tok_s"]
        for r in map(json.loads, filter(None, path.read_text().splitlines()))
        if r.get("kind") == "decode" and r.get("n_seq") == 8 and "paged" in r.get("variant", "")
    ]
    rates.sort()
    return round(rates[len(rates) // 2], 2) if rates else None


def figures(load: dict[str, Any] | None) -> dict[str, Any]:
    """One server's figures in the report."""
    if load is None:
        return {"missing": True}
    source = load["baseline"].get("nvidia_smi_source")
    return {
        "flags": load["serve_flags"],
        "answered": load["answered"],
        "errors": load["errors"],
        "wall_s": load["wall_s"],
        "ttft_s": load["ttft_s"],
        "finish_s": load["finish_s"],
        "decode_window": load["decode_window"],
        "peak_device_memory_gib": {
            "nvidia_smi": gib(
                None if load["peak_nvidia_smi_mib"] is None else load["peak_nvidia_smi_mib"] * 2**20
            ),
            "nvidia_smi_source": source,
            "ledger": gib(load["peak_ledger_device_bytes"]),
        },
        "nvidia_smi_changes": load.get("nvidia_smi_changes"),
        "after_probe": load.get("after_probe"),
        "start_lines": load["baseline"].get("start_lines", []),
    }


def loads_figures(
    paged: dict[str, Any] | None, unpaged: dict[str, Any] | None, decode_rate: float | None
) -> dict[str, Any]:
    """The paged and unpaged loads' records (load_record) and decode.py's paged rate as the
    figures of one record: the paged server's at the top, the unpaged one's under "unpaged"."""
    record: dict[str, Any] = {}
    if paged is not None:
        window = paged["decode_window"]
        limit = paged["baseline"].get("device_memory_limit_bytes")
        record |= {
            "requests": paged["requests"],
            "prompt_tokens": paged["prompt_tokens"],
            "max_tokens": paged["max_tokens"],
            "device_memory_limit_gib": gib(limit),
            "ledger_back_to_baseline": paged["back_to_baseline"]["all"],
            "back_to_baseline": paged["back_to_baseline"],
            **figures(paged),
            "decode_py_paged_tokens_per_s": decode_rate,
            "decode_window_over_decode_py": round(window["tokens_per_s"] / decode_rate, 3)
            if window["tokens_per_s"] and decode_rate
            else None,
            "hit_rate": paged["hit_rate"],
            "pcie_bytes": None
            if paged["pcie_bytes"] is None
            else {**paged["pcie_bytes"], "per_decode_step": window["to_device_per_step"]},
            "staged_blocks": paged["staged_blocks"],
            "cancel_prompt_tokens": paged.get("cancel_prompt_tokens"),
            "cancel": paged.get("cancel"),
            "hot_blocks": paged["baseline"]["hot_blocks"] and int(paged["baseline"]["hot_blocks"]),
        }
    record["unpaged"] = figures(unpaged)
    if paged is not None and unpaged is not None:
        last = [max(filter(None, x["ttft_s"]), default=None) for x in (paged, unpaged)]
        record["last_ttft_over_unpaged"] = (
            round(last[0] / last[1], 3) if last[0] and last[1] else None
        )
    return record


def cmd_report(args: argparse.Namespace) -> int:
    def read(name: str) -> dict[str, Any] | None:
        p = args.state / name
        return json.loads(p.read_text()) if p.exists() else None

    paged, unpaged = read("paged-load.json"), read("unpaged-load.json")
    decode_rate = decode_py_rate(args.decode)
    commit = git_commit()
    record: dict[str, Any] = {
        "scenario": "mission",
        "model_kind": args.kind or "random",  # random weights, or the locality model
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **commit,
        "source_digest": source_digest(),
        "gpu": gpu_name(),
        "missing": [
            name
            for name, v in (("paged", paged), ("unpaged", unpaged), ("decode_py", decode_rate))
            if v is None
        ],
        **loads_figures(paged, unpaged, decode_rate),
    }
    sha = (commit["commit"] or "unknown")[:7]
    kind = f"-{args.kind}" if args.kind else ""
    name = f"{time.strftime('%Y-%m-%d', time.gmtime())}-{sha}-mission{kind}.json"
    for folder in filter(None, (args.results, args.copy_to)):
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / name, record)
        print(f"report: {folder / name}")
    print(json.dumps(record))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    smi = sub.add_parser("smi", help="sample nvidia-smi until a process exits")
    smi.add_argument("--pid", type=int, required=True)
    smi.add_argument("--out", type=Path, required=True)
    smi.add_argument("--every", type=float, default=1.0)
    base = sub.add_parser("baseline", help="the figures right after start")
    base.add_argument("url")
    base.add_argument("--smi", type=Path, help="the smi subcommand's file")
    base.add_argument("--log", type=Path, help="the server's output, for its start lines")
    base.add_argument("--out", type=Path, required=True)
    load = sub.add_parser("load", help="the concurrent requests, cancellations, the end state")
    load.add_argument("url")
    load.add_argument("--baseline", type=Path, required=True)
    load.add_argument("--smi", type=Path)
    load.add_argument("--out", type=Path, required=True)
    load.add_argument("--requests", type=int, default=8)
    load.add_argument("--prompt-tokens", type=int, default=255000)
    load.add_argument("--max-tokens", type=int, default=256)
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--serve-flags", default="", help="recorded with the results")
    load.add_argument("--cancel-checks", action="store_true")
    load.add_argument(
        "--cancel-prompt-tokens", type=int, help="the cancelled prompts' (default: --prompt-tokens)"
    )
    load.add_argument("--poll", type=float, default=0.5, help="seconds between /metrics reads")
    load.add_argument("--cancel-poll", type=float, default=0.05)
    load.add_argument("--progress-every", type=float, default=30.0)
    report = sub.add_parser("report", help="one record of the paged and unpaged runs")
    report.add_argument("--state", type=Path, required=True)
    report.add_argument("--decode", type=Path, help="bench/decode.py's JSON lines")
    report.add_argument("--results", type=Path, help="folder of the record (bench/results)")
    report.add_argument("--copy-to", type=Path, help="a second folder for the record")
    report.add_argument(
        "--kind", default="", help="the model's kind (locality): in the record and its file name"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = {"smi": cmd_smi, "baseline": cmd_baseline, "load": cmd_load, "report": cmd_report}
    return command[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
