"""One JSON line about a quantized GGUF (bench/quant_run.sh): which tool wrote it from which
source, its size, bytes by tensor type, the quantize time, and the run's commits and GPU.

    python bench/quant_record.py FILE --source SRC --tool pyqsa --type Q4_K_M --seconds 93.1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyqsa.bench.meta import git_commit, gpu_name, source_digest, upstream_commit


def record(path: Path, source: Path, tool: str, qtype: str, seconds: float | None) -> dict:
    from pyqsa.convert.inspect import summarize

    return {
        "kind": "quantize",
        **git_commit(),
        "source_digest": source_digest(),
        "upstream_commit": upstream_commit(),
        "gpu": gpu_name(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool": tool,
        "type": qtype,
        "model": path.name,
        "model_bytes": path.stat().st_size,
        "source": source.name,
        "source_bytes": source.stat().st_size,
        "bytes_by_type": summarize(path).bytes_by_type,
        "seconds": seconds,  # None: the file was written by an earlier call
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--tool", choices=["pyqsa", "llama-quantize"], required=True)
    ap.add_argument("--type", dest="qtype", required=True)
    ap.add_argument("--seconds", type=lambda s: None if s == "null" else float(s), default=None)
    a = ap.parse_args(argv)
    print(json.dumps(record(a.file, a.source, a.tool, a.qtype, a.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
