"""tests/gpu/prefix_exact.py on the CPU demo model: the script runs its three cases, and on the
CPU, whose products round a row the same whatever the rows beside it, every follow-up resumed
from the cache equals the engine without it, aligned chunks or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyqsa.demo_model import demo_model_path

SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "prefix_exact.py"


def test_every_case_resumes_and_equals_the_cold_engine(tmp_path):
    out = tmp_path / "exact.json"
    model = str(demo_model_path(tmp_path))
    args = [sys.executable, str(SCRIPT), model, "--history", "600", "--new", "200"]
    run = subprocess.run([*args, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["aligned_same"] and record["histories_same"]
    assert record["scenario"] == "prefix-exact" and record["commit"] and record["utc"]
    assert [c["case"] for c in record["cases"]] == [
        "aligned, unpaged",
        "aligned, paged",
        "wider, paged",
    ]
    for c in record["cases"]:
        assert c["cached_tokens"] == 600 and c["starts"]["resume"] == 1, c
        assert c["follow_up"]["same"] and c["follow_up"]["first_difference"] is None, c
        assert c["first_token_s"]["cached"] > 0 and c["engine_seconds"] > 0


def test_a_history_that_is_no_multiple_of_the_new_tokens_is_a_usage_error(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "m.gguf", "--history", "601", "--new", "200"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "multiple" in run.stderr
