"""`pyqsa bench --quick` end to end on the demo model: every scenario, its result file (named
like bench/results', with medians, spread, counts, flags, device and commit), the table it
prints, and the report drawing its plots and README rows from those files."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import pytest

from pyqsa.bench import plots, report, results
from pyqsa.bench.meta import RESULTS
from pyqsa.bench.scenarios import capacity, server, steps

NAME = re.compile(
    r"^\d{4}-\d{2}-\d{2}-([0-9a-f]{7}|nocommit)-(steps|server|capacity|long|prefix)\.json$"
)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYQSA_CACHE_DIR": str(cache_dir)}
    cmd = [sys.executable, "-m", "pyqsa.cli", "bench", "--quick", "--threads", "1"]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    docs = {}
    for path in out.iterdir():
        assert NAME.match(path.name), path.name
        doc = json.loads(path.read_text())
        docs[doc["scenario"]] = (path, doc)
    return proc, docs


def test_one_file_per_scenario_with_the_run_identity(bench_run):
    proc, docs = bench_run
    assert docs.keys() == {"steps", "server", "capacity", "long", "prefix"}
    for path, doc in docs.values():
        assert path.name.startswith(doc["date"]) and doc["utc"].startswith(doc["date"])
        assert doc["commit"] is None or path.name.split("-")[3] == doc["commit"][:7]
        assert doc["device"]["backend"] == "CPU" and doc["gpu"] is None
        assert doc["device"]["devices"][0]["name"] == "CPU"
        assert doc["model"].startswith("demo-") and doc["model_bytes"] > 0
        assert doc["flags"]["preset"] == "quick"
        assert doc["wall_s"] > 0
        for f in doc["summary"]:
            if f["n"]:
                assert f["min"] <= f["median"] <= f["max"], f
            else:  # nothing measured (e.g. no window in which every request decoded)
                assert f["median"] is None and f["min"] is None, f


def test_steps_holds_decode_and_prefill_of_both_variants(bench_run):
    _, docs = bench_run
    doc = docs["steps"][1]
    size = steps.SIZES["quick"]
    recs = doc["records"]
    decode = [r for r in recs if r["kind"] == "decode"]
    # every (variant, context, sequences) once a repeat
    keys = sorted((r["variant"], r["context"], r["n_seq"]) for r in decode)
    want = sorted(
        (v, c, n)
        for v in ("pyqsa", "pyqsa-paged")
        for c in size["contexts"]
        for n in size["seqs"]
        for _ in range(size["repeats"])
    )
    assert keys == want
    assert all(r["logits_finite"] for r in decode)
    # the summary's median is the median of the runs' own figures
    for f in doc["summary"]:
        if f["figure"] == "decode pyqsa, 8 x 2048" and f["unit"] == "tok/s":
            runs = sorted(r["tok_s"] for r in decode if r["n_seq"] == 8 and r["context"] == 2048
                          and r["variant"] == "pyqsa")  # fmt: skip
            assert f["median"] == pytest.approx(runs[1]) and f["n"] == 3
            assert (f["min"], f["max"]) == pytest.approx((runs[0], runs[-1]))
            break
    else:
        pytest.fail("no decode figure at 8 x 2048")
    prefill = [f for f in doc["summary"] if f["figure"].startswith("prefill ")]
    assert len(prefill) == 2 * len(size["contexts"]) and all(f["median"] > 0 for f in prefill)
    row = next(r for r in doc["decode"] if (r["context"], r["n_seq"]) == (2048, 8))
    assert row["pyqsa"]["runs"] == 3 and row["pyqsa-paged"]["paging_per_step"]["misses"] >= 0


def test_server_scenarios_and_their_figures(bench_run):
    _, docs = bench_run
    doc = docs["server"][1]
    size = server.SIZES["quick"]
    by = {s["scenario"]: s for s in doc["scenarios"]}
    assert list(by) == [
        "idle_ttft", "single_stream", "decode_together", "short_behind_long", "decode_py"
    ]  # fmt: skip
    # each load its own prompts: none starts from another's prefix cache entries
    seeds = [by[name]["seed"] for name in list(by)[1:4]]
    assert len(set(seeds)) == 3
    assert len(by["idle_ttft"]["text"]["ms"]) == size["ttft_runs"]
    assert by["decode_together"]["answered"] == size["requests"]
    assert len(by["decode_together"]["runs"]) == size["repeats"]
    for run in by["decode_together"]["runs"]:
        assert len(run["ttft_s"]) == size["requests"] and run["together_tok_s"] > 0
    figures = {f["figure"]: f for f in doc["summary"]}
    assert figures["8 concurrent TTFT"]["n"] == size["requests"] * size["repeats"]
    assert figures["short TTFT behind 7 long"]["median"] > 0
    assert figures["single stream decode"]["unit"] == "tok/s"
    # where the window's steps went; the server runs with the prefix cache (its default)
    forward, host = (figures[f"8 concurrent decode step, {p}"] for p in ("forward", "host"))
    assert forward["n"] == host["n"] > 0 and forward["median"] > 0
    cache = figures["8 concurrent decode step, host: prefix cache"]
    assert cache["n"] == host["n"] and 0 <= cache["median"] <= host["max"]
    heads = figures["8 concurrent decode window, snapshots' heads taken"]
    copies = figures["8 concurrent decode step, beside it: row copies"]
    assert heads["n"] == copies["n"] == host["n"] and heads["min"] >= 0 and copies["min"] >= 0
    # decode.py at the same batch, run after the server, and the server's rate over it
    ref = by["decode_py"]
    assert len(ref["runs"]) == size["repeats"]
    assert {(r["n_seq"], r["context"]) for r in ref["runs"]} == {(8, ref["context"])}
    assert ref["context"] == size["prompt_tokens"] + size["max_tokens"] // 2
    assert ref["sampling"] == "host"  # a CPU server draws on the host
    rates = [r["together_tok_s"] for r in by["decode_together"]["runs"]]
    over = figures["8 concurrent decode together over decode.py's"]
    assert over["n"] == size["repeats"]
    assert over["median"] == pytest.approx(
        statistics.median(a / r["tok_s"] for a, r in zip(rates, ref["runs"], strict=True))
    )
    assert doc["ratios"]["decode_together_over_decode_py"] == round(over["median"], 3)
    assert doc["serve_flags"].startswith("--slots 8 --ctx 1024")
    assert any(line.startswith("pyqsa: memory") for line in doc["start_lines"])


def test_the_table_lists_every_figure_and_the_files(bench_run):
    proc, docs = bench_run
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("scenario "))
    rows = [line for line in lines[head + 2 :] if line.split(" ")[0] in docs]
    assert len(rows) == sum(len(doc["summary"]) for _, doc in docs.values())
    for path, _ in docs.values():
        assert str(path) in proc.stdout


def test_the_report_draws_the_steps_file(bench_run, tmp_path):
    path, doc = bench_run[1]["steps"]
    d = results.Doc(path, doc["date"], "abc1234", "steps", doc, doc["utc"])
    assert [c for c, _ in results.curve(d, "pyqsa-paged", 8)] == steps.SIZES["quick"]["contexts"]
    png = plots.decode_plot(d, tmp_path / "decode.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    # a CPU run is no headline run: the report leaves it out
    assert not results.headline(doc)


def test_bad_input_is_a_one_line_usage_error(tmp_path):
    for args in (["--upstream-lib", str(tmp_path)], ["--scenario", "nothing"]):
        proc = subprocess.run(
            [sys.executable, "-m", "pyqsa.cli", "bench", "--quick", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "Error:" in proc.stderr.strip().splitlines()[-1]


def test_capacity_long_and_prefix(bench_run):
    _, docs = bench_run
    rows = docs["capacity"][1]["rows"]
    assert sorted((r["ctx"], r["paged"]) for r in rows) == [
        (c, p) for c in capacity.SIZES["quick"]["contexts"] for p in (False, True)
    ]
    # on a CPU everything is host memory; the paged context holds a hot cache besides the K/V
    for r in rows:
        assert sum(v for k, v in r["ledger"].items() if k.startswith("device.")) == 0
        assert (r["ledger"]["host.hot"] > 0) == r["paged"]
    long = docs["long"][1]
    n = long["requests"]
    assert long["answered"] == long["unpaged"]["answered"] == n
    assert "--kv-offload host" in long["serve_flags"] and long["ledger_back_to_baseline"]
    assert len(long["ttft_s"]) == len(long["unpaged"]["ttft_s"]) == n
    prefix = docs["prefix"][1]
    cached = next(f for f in prefix["summary"] if f["figure"] == "follow-up prompt cached")
    assert cached["median"] > 0.9 and cached["n"] == prefix["agents"] * prefix["turns"]


def test_gpu_runs_of_these_scenarios_feed_the_report(bench_run, tmp_path):
    """The same files, as if the GPU machine had made them, beside the recorded ones: the
    report's rows and plots take them as the newest runs."""
    folder = tmp_path / "results"
    folder.mkdir()
    for path in RESULTS.glob("*.json"):
        shutil.copy(path, folder / path.name)
    for scenario, (_, doc) in bench_run[1].items():
        doc = {**doc, "gpu": "Test GPU", "model": "flash-next-synth-000000000000.gguf"}
        (folder / f"2099-01-01-abc1234-{scenario}.json").write_text(json.dumps(doc))
    docs = results.load(folder)
    assert {d.kind for d in docs if d.date == "2099-01-01"} == set(bench_run[1])
    block = report.block(docs)
    server_doc = bench_run[1]["server"][1]
    together = next(s for s in server_doc["scenarios"] if s["scenario"] == "decode_together")
    assert f"decoding together: {together['together_tok_s']} tok/s" in block
    long = bench_run[1]["long"][1]
    assert f"{long['requests']} x {long['prompt_tokens']:,}-token prompts at once" in block
    assert "`pyqsa serve --kv-offload host`" in block  # the quick long load's paged flags
    assert "2099-01-01-abc1234-capacity.json" in block
    written = report.write_plots(docs, tmp_path / "plots")
    assert [p.name for p in written] == list(report.PLOTS)


def test_a_failing_upstream_library_is_listed_and_the_rest_measured(tmp_path, monkeypatch):
    """The comparison library may not fit or load where pyqsa's does: its failure is in the
    document, pyqsa's runs are still there, and a failing run of pyqsa's own fails the scenario."""
    from pyqsa.bench.scenarios import Bench
    from pyqsa.demo_model import demo_model_path

    monkeypatch.setitem(
        steps.SIZES, "quick", {**steps.SIZES["quick"], "contexts": [512, 1024], "seqs": [1]}
    )
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "libllama.so").write_bytes(b"not a library")
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "out"
    bench = Bench(demo_model_path(), "quick", work, 1, 1, upstream, out)
    doc = steps.run(bench)
    # upstream failed at the first context and was not run at the second
    assert [(f["variant"], f["context"]) for f in doc["failed"]] == [("upstream", 512)]
    assert doc["failed"][0]["reason"]
    assert sum("--variant upstream" in c for c in doc["commands"]) == 1
    assert {r["variant"] for r in doc["records"]} == {"pyqsa", "pyqsa-paged"}
    assert {r["context"] for r in doc["records"] if r["kind"] == "decode"} == {512, 1024}
    failed = [f for f in doc["summary"] if f["figure"] == "upstream at 512: failed"]
    assert failed and failed[0]["n"] == 0

    # written as it went: the last write holds every run
    (written,) = out.iterdir()
    last = json.loads(written.read_text())
    assert last["partial"] == {"runs_done": 6, "runs": 6}
    # the devices are asked for once the runs are over (a CUDA context in this process would
    # hold device memory while decode.py runs), so the partial files name none
    assert last["device"] is None and doc["device"]["backend"] == "CPU"
    assert {k: v for k, v in last.items() if k not in ("partial", "device")} == {
        k: v for k, v in doc.items() if k != "device"
    }

    # a run cut short (here by a failing run of pyqsa's) keeps the runs before it on disk
    ok = ["--variant", "pyqsa"]
    monkeypatch.setattr(steps, "variants", lambda b: {"pyqsa": ok, "bad": ["--variant", "x"]})
    with pytest.raises(RuntimeError, match="decode.py failed"):
        steps.run(bench)
    kept = json.loads(written.read_text())
    assert kept["partial"] == {"runs_done": 1, "runs": 4}
    assert {(r["variant"], r["context"]) for r in kept["records"]} == {("pyqsa", 512)}
