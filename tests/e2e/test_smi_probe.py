"""bench/smi_probe.py against a real server: a line a shape, and its refusal of a bad shape."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "smi_probe.py"


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_a_line_a_shape(small_server):
    s = small_server
    out = probe(s.url, "--pid", str(s.proc.pid), "--shapes", "1x100,1x200")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    # no nvidia-smi on this machine: the figure is "-"
    assert lines[0] == "start -"
    assert [line.split()[0] for line in lines[1:]] == ["1x100", "1x200"]
    assert all(re.fullmatch(r"1x\d+ \d+\.\d -", line) for line in lines[1:]), lines


def test_a_bad_shape_is_refused(small_server):
    out = probe(small_server.url, "--pid", "1", "--shapes", "1x100,8by6000")
    assert out.returncode == 2
    assert "a shape is REQUESTSxTOKENS, got '8by6000'" in out.stderr


def test_no_server_is_a_one_line_error():
    out = probe("http://127.0.0.1:9", "--pid", "1", "--shapes", "1x100")
    assert out.returncode == 2
    assert "no pyqsa server's models at http://127.0.0.1:9/v1/models" in out.stderr
    assert "Traceback" not in out.stderr
