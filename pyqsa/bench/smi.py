"""nvidia-smi sampled while a server runs: the process's device memory where nvidia-smi lists
processes, else the GPU's (on the device machine the server is its only user). One line a
sample, `unix time,process MiB,GPU MiB`, appended to a file that readers parse as it grows."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def smi_read(pid: int, gpu: str) -> tuple[int | None, int] | None:
    """(the process's MiB or None where nvidia-smi lists no process of that id, the GPU's used
    MiB); None when nvidia-smi fails."""

    def query(*args: str) -> list[str] | None:
        try:
            out = subprocess.run(
                ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.splitlines() if out.returncode == 0 else None

    used = query("-i", gpu, "--query-gpu=memory.used")
    apps = query("--query-compute-apps=pid,used_memory")
    if not used:
        return None
    mine = [
        int(u) for p, _, u in (line.partition(",") for line in apps or []) if p.strip() == str(pid)
    ]
    return (sum(mine) if mine else None), int(used[0])


def smi_sample(pid: int, out: Path, every: float) -> None:
    """Appends `unix time,process MiB,GPU MiB` to `out` every `every` seconds until `pid` exits
    (the process field empty where nvidia-smi lists no such process: in a container it may show
    none)."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    with open(out, "a") as f:
        while _alive(pid):
            read = smi_read(pid, gpu)
            if read is not None:
                process, total = read
                f.write(f"{time.time():.3f},{'' if process is None else process},{total}\n")
                f.flush()
            time.sleep(every)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (an exited process its parent has not reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _smi_rows(path: Path | None) -> list[list[str]]:
    if path is None or not path.exists():
        return []
    return [line.split(",") for line in path.read_text().splitlines() if line.count(",") == 2]


def smi_source(path: Path | None) -> str | None:
    """Which figure smi_samples gives: "process" where every sample has the process's, else
    "gpu" (the GPU's used memory: on the device machine the server is its only user)."""
    rows = _smi_rows(path)
    return None if not rows else "process" if all(r[1] for r in rows) else "gpu"


def smi_samples(path: Path | None) -> list[tuple[float, int]]:
    """(unix time, MiB) of each sample, of the figure smi_source names."""
    rows = _smi_rows(path)
    per_process = smi_source(path) == "process"
    return [(float(t), int(p if per_process else g)) for t, p, g in rows]


def smi_after(path: Path | None, since: float, timeout: float = 10.0) -> int | None:
    """The first nvidia-smi sample taken after unix time `since` (waiting up to `timeout` s for
    one); None without a sampler."""
    deadline = time.time() + timeout
    while True:
        later = [mib for t, mib in smi_samples(path) if t > since]
        if later or path is None or not path.exists() or time.time() > deadline:
            return later[0] if later else None
        time.sleep(0.5)


def smi_peak(path: Path | None, since: float) -> int | None:
    seen = [mib for t, mib in smi_samples(path) if t >= since]
    return max(seen) if seen else None


def smi_changes(path: Path | None, since: float, until: float, most: int = 64) -> list[list[float]]:
    """[seconds after `since`, MiB] of each sample between the unix times `since` and `until`
    whose figure differs from the sample before it (the first `most`): when the device memory
    outside the ledger grew, against the load's progress."""
    seen = [(t, mib) for t, mib in smi_samples(path) if since <= t <= until]
    pairs = zip(seen, seen[1:], strict=False)
    return [[round(t - since, 1), mib] for (_, a), (t, mib) in pairs if mib != a][:most]
