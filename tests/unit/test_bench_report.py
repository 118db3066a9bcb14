"""python -m pyqsa.bench.report on the recorded files of bench/results/: README.md's results
block and the plots are what the files give (the PNG bytes are compared: the same files and
pinned matplotlib draw the same bytes), every row comes from the file it names, and a new
recorded run changes them."""

from __future__ import annotations

import json
import shutil

import pytest

from pyqsa.bench import report, results
from pyqsa.bench.meta import RESULTS, ROOT

# the long-context server record the block's capacity row comes from
MISSION = results.long_source(results.load(RESULTS)).path.name


@pytest.fixture
def copy(tmp_path):
    """bench/results' JSON files and README.md in a scratch folder."""
    folder = tmp_path / "results"
    folder.mkdir()
    for path in RESULTS.glob("*.json"):
        shutil.copy(path, folder / path.name)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return folder


def test_the_readme_block_and_the_plots_are_up_to_date():
    assert report.main(["--check"]) == 0


def test_the_plots_are_drawn_the_same_every_time(tmp_path):
    docs = results.load(RESULTS)
    first = report.write_plots(docs, tmp_path / "a")
    second = report.write_plots(docs, tmp_path / "b")
    assert [p.name for p in first] == list(report.PLOTS)
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()
        assert a.read_bytes() == (RESULTS / "plots" / a.name).read_bytes()


def test_every_row_names_an_existing_file_and_its_commit():
    block = report.block(results.load(RESULTS))
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    kinds = [row.split(" | ")[0].lstrip("| ") for row in rows[1:]]
    assert kinds[0] == "capacity" and set(kinds) == {"capacity", "speed", "long context", "prefix"}
    for row in rows[1:]:
        name = row.split("](bench/results/")[1].rstrip(") |")
        assert (RESULTS / name).is_file()
        commit = name.split("-")[3]
        assert f"| {commit}, {name[:10]} |" in row
    mission = json.loads((RESULTS / MISSION).read_text())
    peak = mission["peak_device_memory_gib"]["nvidia_smi"]
    assert f"at most {peak:.2f} GiB of the device" in block
    assert f"unpaged: {mission['unpaged']['peak_device_memory_gib']['nvidia_smi']:.2f}" in block


def test_a_new_run_changes_the_block_and_a_cpu_run_does_not(copy, tmp_path):
    readme = tmp_path / "README.md"
    args = ["--results", str(copy), "--readme", str(readme)]
    assert report.main(args) == 0  # writes the block and the plots into the copy
    assert report.main([*args, "--check"]) == 0
    before = readme.read_text()
    # a CPU run of the same scenario: not a headline run, nothing changes
    cpu = json.loads((copy / MISSION).read_text()) | {"gpu": None}
    (copy / "2026-12-04-abc1234-mission.json").write_text(json.dumps(cpu))
    assert report.main([*args, "--check"]) == 0
    # a newer GPU run: its figures replace the older ones, and the check fails until rewritten
    newer = json.loads((copy / MISSION).read_text())
    newer["peak_device_memory_gib"]["nvidia_smi"] = 21.5
    newer["ttft_s"] = [100.0] * 8
    newer["utc"] = "2026-12-31T00:00:00Z"
    (copy / "2026-12-31-def5678-mission.json").write_text(json.dumps(newer))
    assert report.main([*args, "--check"]) == 1
    assert report.main(args) == 0
    after = readme.read_text()
    assert after != before and "at most 21.50 GiB of the device" in after
    assert "def5678, 2026-12-31" in after and "2026-12-31-def5678-mission.json" in after
    assert report.main([*args, "--check"]) == 0


def test_the_quantized_files_row_takes_the_newest_call_with_f16_beside_them():
    docs = results.load(RESULTS)
    ((kind, text, doc),) = report.quant_rows(docs)
    rows = {r["type"]: r for r in doc.data["rows"] if r.get("variant") == "pyqsa"}
    assert kind == "speed" and doc.kind == "quant"
    for t in ("f16", "Q4_K_M"):
        one, eight = rows[t]["decode_tok_s"]["32768x1"], rows[t]["decode_tok_s"]["32768x8"]
        assert f"{one:.1f} / {eight:.1f}" in text
    runs = min(n for r in rows.values() for n in r["decode_runs"].values())
    assert text.endswith(f"medians of {runs} runs)")
    # the newest of the calls that qualify (older ones ran no f16 source or had no variants)
    ok = [d for d in docs if d.kind == "quant" and report._quant_cells(d) is not None]
    assert len(ok) >= 2 and doc is ok[-1]
    # a call without the f16 source's runs gives no row
    lone = results.Doc(doc.path, doc.date, doc.commit, "quant", {"rows": [rows["Q4_K_M"]]})
    assert report.quant_rows([lone]) == []


def test_a_stale_plot_fails_the_check(copy, tmp_path):
    args = ["--results", str(copy), "--readme", str(tmp_path / "README.md")]
    report.main(args)
    (copy / "plots" / "ttft.png").write_bytes(b"\x89PNG stale")
    assert report.main([*args, "--check"]) == 1


def test_a_readme_without_the_markers_is_refused(copy, tmp_path):
    (tmp_path / "README.md").write_text("# no block here\n")
    with pytest.raises(SystemExit, match="no results block"):
        report.main(["--results", str(copy), "--readme", str(tmp_path / "README.md")])


def test_the_decode_plot_takes_the_run_with_the_most_curves():
    docs = results.load(RESULTS)
    doc = results.decode_source(docs)
    # the newest run with pyqsa, paged and upstream at 1 and 8 sequences over two contexts or
    # more: `pyqsa bench`'s steps scenario on the GPU, four contexts
    assert doc.path.name == "2026-12-05-9470e5e-steps.json"
    for v in results.CURVE_VARIANTS:
        for n in results.CURVE_SEQS:
            assert [c for c, _ in results.curve(doc, v, n)] == [8192, 32768, 131072, 262144]
    # an older run with every curve, but over fewer contexts, is not newer: not taken
    older = next(d for d in docs if d.path.name == "2026-12-01-8f8e313-decode.json")
    assert older.order < doc.order
    assert results.memory_source(docs) is not None
    # the TTFT plot: the newest server record with idle TTFT, whichever tool wrote it
    served = [d for d in docs if "idle_ttft" in results.serve_scenarios(d)]
    assert {d.kind for d in served} == {"serve", "server"}
    assert results.ttft_source(docs) is served[-1]


def test_the_locality_model_has_a_table_of_its_own():
    local = results.load(RESULTS, "locality")
    assert local and all("-locality" in " ".join(results._gpu_and_models(d.data)[1]) for d in local)
    assert not {d.path for d in local} & {d.path for d in results.load(RESULTS)}
    block = report.block(results.load(RESULTS), local)
    head, table = block.split("With the locality model", 1)
    assert "-locality" not in head.split("| --- |", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows[1:]] == [
        "speed",
        "speed",
        "long context",
        "long context",
        "prefix",
    ]
    # the newest record of each scenario (by the time its runs ended: two of one date are
    # ordered by it, not by their commits' names)
    newest = lambda kind: max((d for d in local if d.kind == kind), key=lambda d: d.order)  # noqa: E731
    # the newest record of the mission in which both servers ran (a paged-only one has no ratio)
    both = [
        d for d in local if d.kind == "mission-locality" and "decode_window" in d.data["unpaged"]
    ]
    mission = max(both, key=lambda d: d.order).data
    paged = mission["decode_window"]["tokens_per_s"]
    unpaged = mission["unpaged"]["decode_window"]["tokens_per_s"]
    assert f"{paged} tok/s against the unpaged server's {unpaged}, {paged / unpaged:.3f}x" in block
    # pyqsa against unpatched upstream, from the newest record where both decoded
    vs = max(
        (
            d
            for d in local
            if any(r.get("pyqsa") and r.get("upstream") for r in d.data.get("decode", []))
        ),
        key=lambda d: d.order,
    ).data
    first = min(
        (r for r in vs["decode"] if r.get("upstream")), key=lambda r: (r["context"], r["n_seq"])
    )
    ms = first["pyqsa"]["step_ms_median"], first["upstream"]["step_ms_median"]
    assert (
        f"{ms[0]:.2f} ms a step ({1000 * first['n_seq'] / ms[0]:.0f} tok/s) against {ms[1]:.2f}"
        in block
    )
    agents = newest("prefix").data
    runs = len(agents.get("runs", []))
    how = f"median of {runs} runs'" if runs else "one run, median of 20 follow-ups"
    assert f"after {agents['follow_up_ttft_s']:.2f} s ({how}" in block


def test_every_row_names_the_gpu_it_was_measured_on():
    docs, local = results.load(RESULTS), results.load(RESULTS, "locality")
    block = report.block(docs, local)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "](bench/" in line]
    assert rows
    for d in [*docs, *local]:
        for row in (r for r in rows if f"[{d.path.name}]" in r):
            assert row.split(" | ")[2] == ", ".join(results.gpus([d])), row
    # figures of two GPUs side by side: the block's rows name both
    assert len({row.split(" | ")[2] for row in rows}) > 1
