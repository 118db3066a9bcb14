"""tests/gpu/agents.sh --small --trace --runs 2 on the CPU, as the GPU machine runs it: the demo
model served paged with the prefix cache and without it, bench/agents.py's agents, the lone agent
compared on both, twice on servers started afresh, and one record of both runs with every figure
tests/gpu/agents.sh promises; each run's trace report (where the follow-ups' time went)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "agents.sh"


@pytest.fixture(scope="module")
def out(tmp_path_factory, cache_dir) -> Path:
    """The folder of what the runs wrote ($OUT)."""
    if any((Path(d) / "nvidia-smi").exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("a GPU machine: agents.sh runs the full-shape model there")
    tmp = tmp_path_factory.mktemp("agents")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYQSA_CACHE_DIR": str(cache_dir),
        "AGENTS_STATE": str(tmp / "state"),
        "OUT": str(tmp / "out"),
    }

    def agents(*args: str, timeout: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(SCRIPT), "--small", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    try:
        # a call too short for a run: what it says to run next names the runs
        first = agents("--trace", "--runs", "2", "--wait", "2", timeout=120)
        assert first.returncode == 75, f"{first.stdout}\n{first.stderr}"
        assert "run `tests/gpu/agents.sh --small --trace --runs 2` again" in first.stdout
        for _ in range(5):  # 75: still running, the same command again
            run = agents("--trace", "--runs", "2", "--wait", "300", timeout=400)
            if run.returncode != 75:
                break
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
        assert "check:" in run.stdout
    finally:
        agents("--runs", "2", "stop", timeout=120)
    for run in ("run1", "run2"):
        assert not (tmp / "state" / run / "warm.pid").exists()  # the servers were stopped
    return tmp / "out"


@pytest.fixture(scope="module")
def record(out: Path) -> dict:
    return json.loads((out / "agents-runs.json").read_text())


def test_each_run_has_its_trace_report(out):
    """--trace: where each follow-up's time went, then the engine thread's head copies."""
    for run in ("run1", "run2"):
        text = (out / f"ttft-trace-{run}.txt").read_text()
        header, *rows = [line.split() for line in text.splitlines() if line.strip()]
        assert header[0] == "n" and "server_ttf" in header
        assert "follow-ups' own snapshots:" in text and "resumes:" in text
        timed = [r for r in rows if len(r) == len(header) and r[0].isdigit()]
        assert timed and all(float(r[header.index("server_ttf")]) > 0 for r in timed)


def test_the_record_is_both_runs(record):
    medians = sorted(r["follow_up_ttft_s"] for r in record["runs"])
    assert record["follow_up_ttft_s_spread"] == medians
    assert record["follow_up_ttft_s"] == pytest.approx(sum(medians) / 2)
    assert {t["run"] for t in record["turn_records"]} == {0, 1}
    assert len(record["device"]["back_to_baseline_runs"]) == 2


def test_the_record_has_every_figure(record):
    assert record["scenario"] == "prefix" and record["agents"] == 2
    assert set(record["ttft_s_by_turn"]) == {"0", "1", "2"}
    assert record["follow_up_ttft_s"] > 0 and record["follow_up_cached_share"] > 0.9
    assert record["host_bytes_held"] > 0
    assert record["device"]["back_to_baseline"]["ledger"] is True
    # the timeline: each agent's turns one after another, each answered after it was sent
    # (sent_s and done_s are rounded to the millisecond, ttft_s is not: a first token within a
    # millisecond of the reply's end may sum past done_s by that rounding)
    for run in (0, 1):
        for a in range(record["agents"]):
            mine = [t for t in record["turn_records"] if (t["run"], t["agent"]) == (run, a)]
            assert [t["turn"] for t in mine] == [0, 1, 2]
            assert all(
                0 <= t["sent_s"] < t["sent_s"] + t["ttft_s"] <= t["done_s"] + 1e-3 for t in mine
            )
            assert all(x["done_s"] <= y["sent_s"] for x, y in zip(mine, mine[1:], strict=False))


def test_the_lone_agent_answers_as_the_server_without_the_cache(record):
    assert [(c["run"], c["turn"]) for c in record["check"]] == [
        (r, t) for r in (0, 1) for t in (0, 1, 2)
    ]
    assert all(c["same_tokens"] and c["same_logprobs"] for c in record["check"])
    assert [c["cached_tokens"] > 0 for c in record["check"]] == [False, True, True] * 2


@pytest.mark.parametrize("runs", ["x", "0", "-1", "2.5"])
def test_a_bad_run_count_is_a_one_line_error(runs, tmp_path):
    proc = subprocess.run(
        [str(SCRIPT), "--small", "--runs", runs],
        cwd=ROOT,
        env={**os.environ, "AGENTS_STATE": str(tmp_path / "state"), "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"agents.sh: --runs takes a count of 1 or more, not '{runs}'"
    )
