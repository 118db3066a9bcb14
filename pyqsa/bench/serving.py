"""A `pyqsa serve` process for the server scenarios: started on a free port, stopped after."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SERVING = re.compile(r"^pyqsa: serving \S+ at (http://\S+)/v1$")
START_TIMEOUT_S = 1800.0  # a full-shape model loads in well under this from a local disk
STOP_TIMEOUT_S = 60.0


class ServeError(RuntimeError):
    """The server did not start (its last lines in the message)."""


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT, no /v1
    pid: int
    flags: list[str]
    start_lines: list[str]  # its "pyqsa: " lines up to the one that says where it serves
    output: list[str] = field(default_factory=list)  # every line so far


def serve_command(model: Path, flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "pyqsa.cli", "serve", str(model), "--port", "0", *flags]


@contextlib.contextmanager
def served(model: Path, flags: list[str]) -> Iterator[Served]:
    """`pyqsa serve MODEL --port 0 FLAGS` while the block runs; raises ServeError when it
    exits or stays silent before saying where it serves."""
    proc = subprocess.Popen(
        serve_command(model, flags),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    output: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # the pipe must never fill, or the server would block writing to it
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            if not url and (m := SERVING.match(output[-1])):
                url.append(m.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.wait(0.2):
            if time.monotonic() > deadline:
                break
        if not url:
            tail = " | ".join(output[-8:])
            raise ServeError(f"pyqsa serve {' '.join(flags)} did not start: {tail}")
        starts = [line for line in output if line.startswith("pyqsa: ")]
        yield Served(url[0], proc.pid, flags, starts, output)
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
