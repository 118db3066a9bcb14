"""tests/gpu/mission.sh --small on the CPU, phase by phase as the GPU machine runs it: the demo
model served paged and unpaged, bench/mission.py's load, cancellations and end-state check,
bench/decode.py's paged step, and the report with every figure the mission record promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "mission.sh"
PHASES = ("start-paged", "load-paged", "start-unpaged", "load-unpaged", "decode-py", "report")
# each server's figures in the record, and the record's own
SERVER_FIELDS = {
    "flags",
    "answered",
    "ttft_s",
    "finish_s",
    "decode_window",
    "peak_device_memory_gib",
}
RECORD_FIELDS = SERVER_FIELDS | {
    "scenario",
    "commit",
    "requests",
    "prompt_tokens",
    "device_memory_limit_gib",
    "ledger_back_to_baseline",
    "decode_py_paged_tokens_per_s",
    "hit_rate",
    "pcie_bytes",
    "cancel",
    "unpaged",
}


@pytest.fixture(scope="module")
def record(tmp_path_factory, cache_dir):
    if os.environ.get("PATH") and any(
        (Path(d) / "nvidia-smi").exists() for d in os.environ["PATH"].split(os.pathsep)
    ):
        pytest.skip("a GPU machine: mission.sh runs the full-shape model there")
    tmp = tmp_path_factory.mktemp("mission")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYQSA_CACHE_DIR": str(cache_dir),
        "MISSION_STATE": str(tmp / "state"),
        "OUT": str(tmp / "out"),
    }
    try:
        for phase in PHASES:
            run = subprocess.run(
                [str(SCRIPT), "--small", phase, "--wait", "300"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=400,
            )
            assert run.returncode == 0, f"{phase}:\n{run.stdout}\n{run.stderr}"
    finally:
        subprocess.run([str(SCRIPT), "--small", "stop"], cwd=ROOT, env=env, timeout=120)
    (written,) = (tmp / "out").glob("*-mission.json")
    return json.loads(written.read_text())


def test_the_record_has_every_figure(record):
    assert RECORD_FIELDS <= record.keys(), RECORD_FIELDS - record.keys()
    assert SERVER_FIELDS <= record["unpaged"].keys()
    assert record["scenario"] == "mission" and record["missing"] == []
    assert record["decode_window"].keys() >= {"seconds", "tokens_per_s", "to_device_per_step"}
    assert record["peak_device_memory_gib"].keys() >= {"nvidia_smi", "ledger"}
    assert record["pcie_bytes"].keys() == {"to_device", "to_host", "per_decode_step"}
    assert (
        "--kv-offload host" in record["flags"] and "--kv-offload none" in record["unpaged"]["flags"]
    )


def test_every_request_was_answered_and_timed(record):
    for server in (record, record["unpaged"]):
        assert server["answered"] == record["requests"] == 8
        assert all(0 < t <= f for t, f in zip(server["ttft_s"], server["finish_s"], strict=True))
        # 8 prompts of 300 tokens, 64 tokens each: all 8 decode together for a while
        assert server["decode_window"]["seconds"] > 0
        assert server["decode_window"]["tokens_per_s"] > 0
    assert record["decode_py_paged_tokens_per_s"] > 0
    assert 0 <= record["hit_rate"] <= 1  # the demo's hot cache (8 blocks) misses, and hits
    assert record["pcie_bytes"]["to_device"] > 0 and record["pcie_bytes"]["to_host"] > 0


def test_cancelled_requests_free_their_slots_and_nothing_is_left_behind(record):
    assert [c["when"] for c in record["cancel"]] == ["prefill", "decode"]
    for c in record["cancel"]:
        assert c["cancelled_in"] == c["when"] and c["freed"], c
    assert record["cancel"][0]["prompt_tokens_in"] < record["cancel_prompt_tokens"]
    assert record["ledger_back_to_baseline"] is True
    assert record["back_to_baseline"]["changed"] == {}
