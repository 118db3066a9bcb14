"""bench/save_probe.py on the CPU demo model: its four timings of snapshot saves, each with a
time for every save and the copy of the staged head, and the times of loading one back."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from pyqsa.demo_model import demo_model_path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "save_probe.py"


def test_the_four_timings_each_time_every_save(tmp_path):
    model = str(demo_model_path(tmp_path))
    args = [sys.executable, str(SCRIPT), model, "--tokens", "600", "--saves", "3"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = {
        m.group(1): m.group(2) for m in re.finditer(r"^([a-z ]+): save ms (.*)$", run.stdout, re.M)
    }
    assert list(lines) == ["alone", "alone again", "beside rows", "beside memory"], run.stdout
    for text in lines.values():
        times, summary = text.split(" | ")
        assert len(times.split()) == 3 and all(float(t) >= 0 for t in times.split())
        assert re.fullmatch(
            r"median [\d.]+; user [\d.]+ sys [\d.]+ faults \d+ a save; fill [\d.]+ ms", summary
        )
    loads = re.search(
        r"^resume ms (.*) \| median ([\d.]+); restore ms (.*) \| median ([\d.]+)$", run.stdout, re.M
    )
    assert loads, run.stdout
    for times in (loads.group(1), loads.group(3)):
        assert len(times.split()) == 3 and all(float(t) >= 0 for t in times.split())
