"""bench/mission.py's pieces that need no server: the nvidia-smi sampler (pyqsa.bench.smi,
against a fake nvidia-smi) and the end-state comparison."""

from __future__ import annotations

import os
import subprocess

from pyqsa.bench import mission, serve_load, smi
from pyqsa.bench.scenarios import long

FAKE_SMI = """#!/bin/sh
case "$*" in
    *--query-gpu=memory.used*) echo 2048 ;;
    *--query-compute-apps*) echo "$FAKE_SMI_PID, $FAKE_SMI_MIB"; echo "1, 5" ;;
esac
"""


def test_the_sampler_follows_the_process_until_it_exits(tmp_path, monkeypatch):
    (tmp_path / "nvidia-smi").write_text(FAKE_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    server = subprocess.Popen(["sleep", "1.2"])
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_PID", str(server.pid))
    monkeypatch.setenv("FAKE_SMI_MIB", "700")
    out = tmp_path / "smi.csv"
    smi.smi_sample(server.pid, out, every=0.2)  # returns once the process is gone
    assert server.poll() == 0
    samples = smi.smi_samples(out)
    assert len(samples) >= 3 and {mib for _, mib in samples} == {700}  # its own line, not pid 1's
    assert smi.smi_source(out) == "process"
    assert smi.smi_peak(out, since=0.0) == 700
    assert smi.smi_after(out, since=samples[1][0]) == 700
    # a process nvidia-smi does not list (as in a container): the GPU's figure
    (tmp_path / "other.csv").write_text("1.0,,2048\n2.0,700,2048\n")
    assert smi.smi_source(tmp_path / "other.csv") == "gpu"
    assert smi.smi_samples(tmp_path / "other.csv") == [(1.0, 2048), (2.0, 2048)]


def test_the_end_state_names_what_did_not_come_back():
    base = {"ledger": {"device.hot": 10, "host.kv": 100, "host.compute": 5}, "nvidia_smi_mib": 900}
    same = mission.compare(base, {**base})
    assert same["all"] and same["changed"] == {}
    grown = {"ledger": {**base["ledger"], "host.compute": 6}, "nvidia_smi_mib": 950}
    got = mission.compare(base, grown)
    assert got["ledger"] is False and got["host_store"] is True and got["host_buffers"] is False
    assert got["nvidia_smi"] is False and got["all"] is False
    assert got["changed"] == {"host.compute": [5, 6], "nvidia_smi_mib": [900, 950]}


def test_the_changes_name_when_the_figure_moved(tmp_path):
    rows = ["10.0,,100", "11.0,,100", "12.0,,164", "13.0,,164", "14.5,,172", "20.0,,999"]
    (tmp_path / "smi.csv").write_text("\n".join(rows) + "\n")
    assert smi.smi_changes(tmp_path / "smi.csv", since=10.0, until=15.0) == [[2.0, 164], [4.5, 172]]
    assert smi.smi_changes(tmp_path / "smi.csv", since=10.0, until=15.0, most=1) == [[2.0, 164]]
    assert smi.smi_changes(None, since=0.0, until=1.0) == []


def test_the_idle_probe_waits_out_the_graph_cache_then_runs_one_request(monkeypatch):
    calls = []
    clock = [0.0]
    monkeypatch.setattr(mission.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(mission, "attempt", lambda *a: calls.append(("attempt", clock[0], a[3])))
    monkeypatch.setattr(mission, "wait_idle", lambda url: calls.append(("idle", clock[0])))
    end = {"nvidia_smi_mib": 900, "ledger": {"device.pool": 4096, "device.hot": 1}}
    monkeypatch.setattr(mission, "snapshot", lambda url, smi: {**end, "unix": clock[0]})
    got = mission.idle_probe("http://x", "m", None)
    assert got == {"nvidia_smi_mib": 900, "device_pool": 4096}
    # the request comes once every graph of the load is older than the backend's eviction age
    assert calls[0][0] == "attempt" and calls[0][1] > mission.CUDA_GRAPH_EVICT_S
    assert calls[0][2] == 1 and calls[1][0] == "idle"


def test_the_decode_window_splits_its_steps_and_counts_their_graphs():
    runs = [
        {"times": [1.0, 2.0, 3.0, 4.0], "completion_tokens": 4},
        {"times": [1.5, 2.5, 3.5, 4.5], "completion_tokens": 4},
    ]

    def metrics(steps, forward, host, launch, direct, replayed):
        return {
            mission.STEPS: steps,
            'pyqsa_engine_step_seconds_total{part="forward"}': forward,
            'pyqsa_engine_step_seconds_total{part="host"}': host,
            'pyqsa_engine_step_seconds_total{part="launch"}': launch,
            serve_load.GRAPHS["reused"]: steps,
            serve_load.GRAPHS["direct"]: direct,
            serve_load.GRAPHS["captured"]: 1,
            serve_load.GRAPHS["replayed"]: replayed,
        }

    snapshots = [
        (1.0, metrics(5, 0.05, 0.005, 0.01, 0, 4)),  # before the window (1.5, 4.0): left out
        (1.6, metrics(10, 0.10, 0.01, 0.02, 0, 9)),
        (3.9, metrics(20, 0.25, 0.02, 0.04, 1, 18)),
    ]
    got = mission.decode_window(runs, snapshots)
    assert got["seconds"] == 2.5 and got["steps"] == 10
    assert got["hit_rate"] is None  # a server that does not page
    assert got["engine"] == {
        "steps": 10,
        "forward_ms_per_step": 15.0,
        "host_ms_per_step": 1.0,
        "launch_ms_per_step": 2.0,
        "host_share": 0.062,
        "graphs_per_step": {"reused": 1.0, "direct": 0.1, "captured": 0.0, "replayed": 0.9},
    }
    # runs that never decoded together: no window, no split
    apart = mission.decode_window([runs[0], {"times": [], "completion_tokens": 0}], snapshots)
    assert apart["seconds"] is None and apart["engine"] is None


def test_the_long_scenario_names_where_its_decode_steps_went():
    def server(engine):
        return {
            "answered": 2,
            "ttft_s": [1.0, 2.0],
            "finish_s": [3.0, 4.0],
            "decode_window": {"tokens_per_s": 10.0, "engine": engine},
            "peak_device_memory_gib": {"ledger": 1.0, "nvidia_smi": None},
        }

    split = {"forward_ms_per_step": 15.0, "host_ms_per_step": 1.0}
    doc = {"requests": 2, "prompt_tokens": 100, "hit_rate": 0.9, **server(split)}
    doc["unpaged"] = server(None)  # its window held too few polls to split
    rows = {r["figure"]: r["median"] for r in long.summary(doc)}
    assert rows["paged: decode step, forward"] == 15.0
    assert rows["paged: decode step, host"] == 1.0
    assert not any(name.startswith("unpaged: decode step") for name in rows)
