"""Running the bench/ scripts from CPU tests: a script as a subprocess, the --small synthetic
model, and decode.py's short run at 1 and 8 sequences on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
LIB = ROOT / ".build" / "py" / "llama_cpp" / "lib"


def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def small_model(out: Path) -> Path:
    """bench/synth_model.py --small written to `out`."""
    run(str(BENCH / "synth_model.py"), str(out), "--small", "--threads", "2")
    return out


# decode.py's short run: 256 tokens, 1 and 8 sequences, 2 steps. NOTE: one thread (this
# machine's cores are shared: OpenMP spin-waits when oversubscribed) and no CPU weight repacking
# (the pinned AMX f16 kernel crashes with 8 streams)
DECODE_ARGS = ["--contexts", "256", "--seqs", "1,8", "--steps", "2", "--warmup", "1"]
DECODE_ARGS += ["--threads", "1", "--no-extra-bufts", "--lib", str(LIB)]


def decode_records(gguf: Path, out: Path) -> list[dict]:
    """decode.py's records of `gguf` with DECODE_ARGS, written to `out`: a prefill, then a decode
    record per sequence count."""
    run(str(BENCH / "decode.py"), str(gguf), "--variant", "pyqsa", *DECODE_ARGS, "--out", str(out))
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["kind"], r.get("n_seq")) for r in recs] == [
        ("prefill", None),
        ("decode", 1),
        ("decode", 8),
    ]
    return recs
