"""server: `pyqsa serve` over HTTP, on a server this scenario starts (the slots and context of
the preset, greedy token-id prompts of exactly max_tokens tokens each):

- idle_ttft: one short request at a time on the idle server, time to first token
  (pyqsa.bench.serve_ttft; text endpoint, then chat with its template);
- single_stream: one long prompt, its time to first token and decode rate;
- decode_together: `requests` long prompts at once, the rate while all decode together;
- short_behind_long: `requests` - 1 long prompts and a short request `short_after` seconds
  later, the short one's time to first token (TTFT under load).

The last three are pyqsa.bench.serve_load's, `repeats` runs each. The document's "scenarios"
holds each one's summary as bench/serve_run.sh records it, with every run under "runs".

After the server has gone, decode.py runs the decode_together load's batch through the C API
(its requests as sequences, its prompts plus half its replies as the context, the server's
sampling), `repeats` times: the rate the server's is held against, in the same run and on the
same machine; the summary gives the server's rate over it, run by run (scenario "decode_py").
"""

from __future__ import annotations

import sys
from typing import Any

from .. import decode_report, record, serve_load, serve_ttft
from ..serving import served
from . import Bench
from .steps import decode_run, machine_flags

SIZES = {
    "quick": {"slots": 8, "ctx": 1024, "batch_tokens": 256, "requests": 8, "prompt_tokens": 512,
              "max_tokens": 64, "short_after": 0.3, "ttft_runs": 10, "ttft_warmup": 2,
              "repeats": 3, "decode_steps": 8, "decode_warmup": 2},
    "cpu": {"slots": 8, "ctx": 2048, "batch_tokens": 256, "requests": 8, "prompt_tokens": 1000,
            "max_tokens": 64, "short_after": 1.0, "ttft_runs": 20, "ttft_warmup": 3,
            "repeats": 3, "decode_steps": 16, "decode_warmup": 4},
    "gpu": {"slots": 8, "ctx": 36000, "batch_tokens": 512, "requests": 8, "prompt_tokens": 32000,
            "max_tokens": 256, "short_after": 2.0, "ttft_runs": 30, "ttft_warmup": 3,
            "repeats": 3, "decode_steps": 32, "decode_warmup": 4},
}  # fmt: skip
SHORT_PROMPT_TOKENS = 64
IDLE_PROMPT_TOKENS = 32
SAMPLING_DEVICE = "pyqsa: sampling: device"  # the start line of a server drawing on the device


def serve_flags(bench: Bench, size: dict[str, Any]) -> list[str]:
    return [
        *("--slots", str(size["slots"]), "--ctx", str(size["ctx"])),
        *("--batch-tokens", str(size["batch_tokens"])),
        *bench.thread_flags(),
    ]


def run(bench: Bench) -> dict[str, Any]:
    size = bench.size(SIZES)
    flags = serve_flags(bench, size)
    long = {"prompt_tokens": size["prompt_tokens"], "max_tokens": size["max_tokens"]}
    loads = {
        "single_stream": {"requests": 1, **long},
        "decode_together": {"requests": size["requests"], **long},
        "short_behind_long": {
            "requests": size["requests"] - 1,
            **long,
            "short_after": size["short_after"],
            "short_prompt_tokens": SHORT_PROMPT_TOKENS,
        },
    }
    idle_requests = 2 * (size["ttft_warmup"] + size["ttft_runs"])
    total = idle_requests + len(loads) * size["repeats"]
    scenarios = []
    with served(bench.model, flags) as server, bench.progress(total, "server", "req") as bar:
        bar.set_postfix_str("idle_ttft")
        idle = serve_ttft.measure(
            server.url,
            IDLE_PROMPT_TOKENS,
            size["ttft_runs"],
            size["ttft_warmup"],
            on_request=bar.update,
        )
        scenarios.append({"scenario": "idle_ttft", **idle})
        # each load its own prompts (seed): none is served from another's prefix cache entries
        for seed, (name, shape) in enumerate(loads.items(), start=1):
            bar.set_postfix_str(name)
            load = serve_load.Load(server.url, repeats=size["repeats"], seed=seed, **shape)
            runs, summary = serve_load.measure(load, lambda i, r: bar.update())
            scenarios.append({"scenario": name, **summary, "runs": runs})
        start_lines = server.start_lines
    scenarios.append(decode_py(bench, size, start_lines))
    doc = record.header("server", bench.model, {"preset": bench.preset, **size})
    doc["serve_flags"] = " ".join(flags)
    doc["start_lines"] = start_lines
    doc["summary"] = summary_of(scenarios)
    over = next(f for f in doc["summary"] if f["unit"] == "x")
    if over["n"]:  # as bench/serve_run.sh records it: README's speed row gives it
        doc["ratios"] = {
            "decode_together_over_decode_py": round(over["median"], 3),
            "decode_together_spread_over_decode_py": [round(over["min"], 3), round(over["max"], 3)],
        }
    doc["scenarios"] = scenarios
    return doc


def decode_py(bench: Bench, size: dict[str, Any], start_lines: list[str]) -> dict[str, Any]:
    """decode.py at the decode_together load's shape, `repeats` runs (see the module's
    docstring); the server has gone, so that its device memory is free."""
    sampling = "device" if any(line.startswith(SAMPLING_DEVICE) for line in start_lines) else "host"
    context = size["prompt_tokens"] + size["max_tokens"] // 2
    out = bench.work / "server-decode.jsonl"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pyqsa.bench.decode", str(bench.model), "--variant", "pyqsa"]
    cmd += [*("--seqs", str(size["requests"]), "--contexts", str(context))]
    cmd += [*("--steps", str(size["decode_steps"]), "--warmup", str(size["decode_warmup"]))]
    cmd += ["--sampling", sampling, "--out", str(out), *machine_flags(bench)]
    with bench.progress(size["repeats"], "server: decode.py") as bar:
        for repeat in range(size["repeats"]):
            reason = decode_run([*cmd, "--seed", str(repeat)], bench.work / "server-decode.log")
            if reason is not None:
                raise RuntimeError(f"decode.py failed ({' '.join(cmd[3:])}): {reason}")
            bar.update()
    runs = [r for r in decode_report.records_of(out) if r.get("kind") == "decode"]
    return {"scenario": "decode_py", "command": " ".join(cmd[1:]), "context": context,
            "sampling": sampling, "runs": runs}  # fmt: skip


def summary_of(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {s["scenario"]: s for s in scenarios}
    idle, single = by["idle_ttft"], by["single_stream"]
    together, short = by["decode_together"], by["short_behind_long"]
    reference = [r["tok_s"] for r in by["decode_py"]["runs"]]
    n = together["requests"]

    def runs(s: dict[str, Any], key: str) -> list[float | None]:
        return [r[key] for r in s["runs"]]

    def steps(part: str) -> list[float | None]:  # where the window's steps went, per run
        return serve_load.window_part(together["runs"], part)

    return [
        record.figure("idle TTFT, text", "ms", idle["text"]["ms"]),
        record.figure("idle TTFT, chat", "ms", idle["chat"]["ms"]),
        record.figure("single stream TTFT", "s", [t for r in single["runs"] for t in r["ttft_s"]]),
        record.figure("single stream decode", "tok/s", runs(single, "together_tok_s")),
        record.figure(
            f"{n} concurrent TTFT", "s", [t for r in together["runs"] for t in r["ttft_s"]]
        ),
        record.figure(f"{n} concurrent decode together", "tok/s", runs(together, "together_tok_s")),
        record.figure(f"decode.py, {n} x {by['decode_py']['context']}", "tok/s", reference),
        # run i of the server against run i of decode.py
        record.figure(
            f"{n} concurrent decode together over decode.py's",
            "x",
            [
                None if rate is None else rate / ref
                for rate, ref in zip(runs(together, "together_tok_s"), reference, strict=False)
            ],
        ),
        record.figure(f"{n} concurrent decode step, forward", "ms", steps("forward")),
        record.figure(f"{n} concurrent decode step, host", "ms", steps("host")),
        # the host's part the prefix cache took (snapshot heads, resumes, restores)
        record.figure(f"{n} concurrent decode step, host: prefix cache", "ms", steps("prefix")),
        record.figure(
            f"{n} concurrent decode window, snapshots' heads taken",
            "heads",
            [(r["together_engine"] or {}).get("snapshots") for r in together["runs"]],
        ),
        record.figure(
            f"{n} concurrent decode window, of them staged",
            "heads",
            [(r["together_engine"] or {}).get("staged") for r in together["runs"]],
        ),
        # the copier thread's row copies run beside the passes, not in them
        record.figure(f"{n} concurrent decode step, beside it: row copies", "ms", steps("copy")),
        record.figure(f"short TTFT behind {n - 1} long", "s", runs(short, "short_ttft_s")),
    ]
