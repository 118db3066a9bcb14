"""Real `pyqsa serve` processes on free ports, driven by real clients.

The model is the embedded demo model (random weights, the real Qwen tokenizer), built by
the converter's write_model into a per-session cache, so these tests need no torch and no
network. Servers start once per session; each test leaves them idle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key"
DEFAULT_MAX_TOKENS = 40
HERE = Path(__file__).resolve().parent
# NOTE: one compute thread per server: the CI machine has 2 cores shared by the server's event
# loop, the test clients and llama.cpp, whose worker threads spin while waiting for each other
THREADS = ["--threads", "1"]


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT (no /v1)
    proc: subprocess.Popen
    model: str = "pyqsa-demo"
    api_key: str | None = None
    log: list[str] = field(default_factory=list)  # the server's output after startup

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics").text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def openai(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.v1, api_key=self.api_key or "none", **kw)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pyqsa-cache")


@pytest.fixture(scope="session")
def demo_gguf(cache_dir) -> Path:
    from pyqsa.demo_model import demo_model_path

    return demo_model_path(cache_dir)


def start_server(args: list[str], env_cache: Path, timeout: float = 120) -> Server:
    env = {**os.environ, "PYQSA_CACHE_DIR": str(env_cache)}
    cmd = [sys.executable, "-m", "pyqsa.cli", "serve", "--port", "0", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving (\S+) at (http://\S+)/v1", line)
        if m:
            server = Server(m.group(2), proc, m.group(1), log=lines)
            # NOTE: keep reading: a full pipe would block the server on its next log line
            threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
            return server
    proc.kill()
    raise RuntimeError("server did not start:\n" + "".join(lines))


def stop_server(s: Server) -> None:
    if s.proc.poll() is not None:
        pytest.fail(f"the server exited early ({s.proc.returncode}):\n" + "".join(s.log[-50:]))
    s.proc.terminate()
    try:
        s.proc.wait(15)
    except subprocess.TimeoutExpired:
        s.proc.kill()


@pytest.fixture(scope="session")
def server(demo_gguf, cache_dir, tmp_path_factory):
    """8 slots of 512 tokens, an API key (from a file), a 1 MiB body limit, requests without
    max_tokens capped at DEFAULT_MAX_TOKENS; tokens drawn on the host on any build (the draws
    test_server_device_sampling compares the device's with)."""
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    key_file.write_text(API_KEY + "\n")
    s = start_server(
        [
            str(demo_gguf),
            "--model-name",
            "pyqsa-demo",
            "--slots",
            "8",
            "--ctx",
            "512",
            "--api-key-file",
            str(key_file),
            "--max-body-bytes",
            str(1 << 20),
            "--default-max-tokens",
            str(DEFAULT_MAX_TOKENS),
            "--sampling",
            "host",
        ],
        cache_dir,
    )
    s.api_key = API_KEY
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def small_server(demo_gguf, cache_dir):
    """1 slot, no waiting room (429 at once), and the test-only tool template; otherwise the
    defaults."""
    s = start_server(
        [
            str(demo_gguf),
            "--model-name",
            "pyqsa-demo",
            "--slots",
            "1",
            "--ctx",
            "256",
            "--batch-tokens",
            "64",
            "--max-waiting",
            "0",
            "--chat-template",
            str(HERE / "tool_template.jinja"),
        ],
        cache_dir,
    )
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def tokenizer(demo_gguf):
    """The server's tokenizer, in the test process (llama.cpp vocabulary of the demo GGUF)."""
    from pyqsa.engine.runner import LlamaModel

    return LlamaModel(str(demo_gguf))


def wait_idle(s: Server, timeout: float = 20) -> dict[str, float]:
    """Metrics once nothing is in flight (requests finish asynchronously after a disconnect)."""
    deadline = time.monotonic() + timeout
    while True:
        m = s.metrics()
        idle = m["pyqsa_busy_slots"] == 0 and m["pyqsa_requests_in_flight"] == 0
        if (idle and m["pyqsa_http_open_requests"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)
