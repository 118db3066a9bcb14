"""`--kv-offload` / `--hot-blocks` (engine/paging.py, server/startup.py): the hot cache's default
from the GGUF, auto's choice, admission control against host memory, the paging counters on
/metrics, and a real `pyqsa serve --kv-offload host --hot-blocks 8` on the demo model (its QSA
layers select 16 tokens in blocks of 4: 4 blocks a query, so 8 by default)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from click.testing import CliRunner
from engine_fakes import Collector, FakeRunner, FakeVocab
from prometheus_client import generate_latest
from pyqsa.server.metrics import Metrics

from pyqsa.cli import main
from pyqsa.engine import Engine, EngineConfig, SamplingParams, paging
from pyqsa.engine.paging import PagingError, QsaKv, plan

NO_ENV_KEY = {"PYQSA_API_KEY": None}
DEMO_KV = QsaKv(n_layers=2, n_head_kv=2, head_dim=32, top_k=16, ratio=4, blocks_selected=4)
GiB = 2**30


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from pyqsa.demo_model import demo_model_path

    cache = tmp_path_factory.mktemp("pyqsa-cache")
    return cache, demo_model_path(cache)


def test_default_hot_blocks_come_from_the_gguf(demo):
    kv = QsaKv.from_gguf(demo[1])
    assert kv == DEMO_KV
    assert kv.default_hot_blocks == 8
    # 2 layers x (K, V) x 2 heads x 32 dims x 2 bytes per token: the ledger's host.kv
    assert kv.kv_bytes("f16", 3 * 512) == 786432
    assert kv.kv_bytes("f32", 1) == 2 * kv.kv_bytes("f16", 1) == 1024
    assert kv.kv_bytes("q8_0", 1) == 2 * 2 * 2 * 34  # a row of 64 is 2 blocks of 34 bytes


def test_plan():
    need = DEMO_KV.kv_bytes("f16", 1000)  # 256000 bytes
    host = 10 * GiB
    # auto: pages when the K/V would take over 80% of the free device memory; no GPU: never
    assert plan(DEMO_KV, "auto", None, 1000, "f16", None, host).hot_blocks == 0
    assert plan(DEMO_KV, "auto", None, 1000, "f16", need, host).hot_blocks == 8
    assert plan(DEMO_KV, "auto", 6, 1000, "f16", int(need / 0.8) - 1, host).hot_blocks == 6
    assert plan(DEMO_KV, "auto", None, 1000, "f16", int(need / 0.8) + 1, host).hot_blocks == 0
    assert plan(DEMO_KV, "none", None, 1000, "f16", 1, host) == paging.PagingPlan(0, need)
    assert plan(DEMO_KV, "host", 5, 1000, "f16", None, host) == paging.PagingPlan(5, need)
    assert plan(DEMO_KV, "host", None, 1000, "f16", None, None).hot_blocks == 8  # not known
    with pytest.raises(PagingError, match="cannot hold the 4 blocks"):
        plan(DEMO_KV, "host", 3, 1000, "f16", None, host)
    with pytest.raises(PagingError, match="cannot go with --kv-offload none"):
        plan(DEMO_KV, "none", 8, 1000, "f16", None, host)
    n = 8 * 262144  # 512 bytes a token: 1 GiB
    with pytest.raises(PagingError, match=r"needs 1\.00 GiB of host memory .* 0\.50 GiB is avail"):
        plan(DEMO_KV, "host", None, n, "f16", None, GiB // 2)
    assert plan(DEMO_KV, "host", None, n, "f16", None, GiB).hot_blocks == 8


def test_host_available_reads_meminfo():
    avail = paging.host_available()
    assert avail is None or avail > 0


def test_cpu_build_auto_is_none():
    assert paging.device_free(None) is None  # the CPU build; a GPU one gives its free bytes
    assert paging.device_free(0) is None


@pytest.fixture
def no_model_load(monkeypatch):
    """Refusals come before the weights load (a test that got past them would serve forever)."""
    import pyqsa.engine.runner

    def refuse(*args, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pyqsa.engine.runner, "LlamaModel", refuse)


def test_hot_blocks_too_few_is_a_usage_error(demo, no_model_load):
    args = ["serve", str(demo[1]), "--kv-offload", "host", "--hot-blocks", "3"]
    r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: Invalid value for '--hot-blocks': 3 cannot hold the 4 blocks one query selects "
        "(indexer top_k 16 / compress ratio 4)"
    ]


def test_host_memory_admission(demo, monkeypatch, no_model_load):
    monkeypatch.setattr(paging, "host_available", lambda: GiB // 2)
    args = ["serve", str(demo[1]), "--kv-offload", "host", "--slots", "8", "--ctx", "262144"]
    r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
    assert r.exit_code == 1, r.output
    assert r.output.splitlines() == [
        "Error: paging needs 1.00 GiB of host memory for the QSA K/V (f16) of 2097152 tokens "
        "(slots x ctx); 0.50 GiB is available (MemAvailable)"
    ]


def test_kv_host_type_sets_the_host_store_type(demo, monkeypatch, no_model_load):
    """The host store (and the hot cache, which holds its blocks) takes --kv-host-type: q8_0
    K/V of the same tokens need 34/64 of the f16 bytes, still more than is available here."""
    monkeypatch.setattr(paging, "host_available", lambda: GiB // 2)
    args = ["serve", str(demo[1]), "--kv-offload", "host", "--slots", "8", "--ctx", "262144"]
    r = CliRunner().invoke(main, [*args, "--kv-host-type", "q8_0"], env=NO_ENV_KEY)
    assert r.exit_code == 1, r.output
    assert r.output.splitlines() == [
        "Error: paging needs 0.53 GiB of host memory for the QSA K/V (q8_0) of 2097152 tokens "
        "(slots x ctx); 0.50 GiB is available (MemAvailable)"
    ]


class PagingRunner(FakeRunner):
    reads = 0

    def paging_stats(self) -> dict[str, int] | None:
        self.reads += 1
        n = len(self.batches)
        return {
            "hits": 3 * n,
            "misses": n,
            "staged": 2 * n,
            "bytes_to_device": 256 * n,
            "bytes_to_host": 512 * n,
            "hot_blocks": 8,
        }

    def paging_layers(self) -> dict[int, tuple[int, int]] | None:
        n = len(self.batches)
        return {3: (2 * n, n), 7: (n, 0)}

    def graph_stats(self) -> dict[str, int]:
        return {}


def _poll(until, timeout: float = 5.0):
    """until() once true (the paging counters are read at most once a second), or fail."""
    deadline = time.monotonic() + timeout
    while not (value := until()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_paging_counters_on_metrics():
    """Read on the engine thread after a forward pass, at most once a second (they wait for
    the device), and once due when the engine idles; shown at scrape."""
    runner = PagingRunner()
    config = EngineConfig("fake.gguf", n_slots=1, ctx_per_slot=16)
    e = Engine(config, runner, FakeVocab()).start()
    try:
        assert runner.reads == 1  # at start
        assert e.stats().paging == {
            "hits": 0,
            "misses": 0,
            "staged": 0,
            "bytes_to_device": 0,
            "bytes_to_host": 0,
            "hot_blocks": 8,
        }
        sink = Collector()
        e.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=4), sink)
        sink.wait()
        n = len(runner.batches)
        assert n == 4
        # 4 passes well within a second: one read after them, once due (not one per pass: 5
        # reads in all; 3 leaves room for a stall of the machine)
        _poll(lambda: e.stats().paging["misses"] == n)
        assert runner.reads <= 3, runner.reads
        text = generate_latest(Metrics(e).registry).decode()
        assert f"pyqsa_paging_hits_total {3.0 * n}" in text
        assert f"pyqsa_paging_misses_total {1.0 * n}" in text
        assert f"pyqsa_paging_staged_total {2.0 * n}" in text
        assert f'pyqsa_paging_bytes_total{{direction="to_device"}} {256.0 * n}' in text
        assert f'pyqsa_paging_bytes_total{{direction="to_host"}} {512.0 * n}' in text
        assert "pyqsa_paging_hot_blocks 8.0" in text
        assert f'pyqsa_paging_layer_hits_total{{layer="3"}} {2.0 * n}' in text
        assert 'pyqsa_paging_layer_misses_total{layer="7"} 0.0' in text
    finally:
        e.stop()
    unpaged = Engine(config, FakeRunner(), FakeVocab()).start()
    try:
        assert unpaged.stats().paging is None
        assert "pyqsa_paging" not in generate_latest(Metrics(unpaged).registry).decode()
    finally:
        unpaged.stop()


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_serve_pages_on_the_demo_model(demo):
    """Three concurrent chats through a paged server; the hot cache (8 blocks of 4 tokens) is
    far smaller than each conversation, so decode steps miss."""
    cache, gguf = demo
    cmd = [sys.executable, "-m", "pyqsa.cli", "serve", str(gguf), "--port", "0", "--threads"]
    cmd += [
        "1",
        "--model-name",
        "demo",
        "--slots",
        "3",
        "--ctx",
        "512",
        "--kv-offload",
        "host",
        "--hot-blocks",
        "8",
    ]
    env = {**os.environ, "PYQSA_CACHE_DIR": str(cache)}
    env.pop("PYQSA_API_KEY", None)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if m := re.search(r"serving \S+ at (http://\S+)/v1", line):
                url = m.group(1)
        assert url, "server did not start:\n" + "".join(lines)
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        paging_line = [x for x in lines if x.startswith("pyqsa: paging:")]
        assert paging_line == [
            "pyqsa: paging: hot cache 8 blocks per slot and QSA layer; host store 0.8 MiB "
            "(f16 K/V of 3 x 512 tokens)\n"
        ]
        before = _metrics(url)
        assert before["pyqsa_paging_hot_blocks"] == 8
        misses = "pyqsa_paging_misses_total"

        def chat(i: int) -> dict:
            body = {
                "model": "demo",
                "messages": [{"role": "user", "content": f"{i}: " + "tell me a story " * 20}],
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
            }
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()

        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(chat, range(3)))
        assert [r["usage"]["completion_tokens"] for r in replies] == [24, 24, 24]
        # the counters are read at most once a second: those of the last steps within one
        after = _poll(lambda: (m := _metrics(url))[misses] > before[misses] and m)
        assert after["pyqsa_paging_hits_total"] > 0
        assert after['pyqsa_paging_bytes_total{direction="to_device"}'] > 0
        assert after['pyqsa_paging_bytes_total{direction="to_host"}'] > 0
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
