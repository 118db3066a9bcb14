"""bench/smi_probe.py: which request first grows a running server's device memory.

Sends requests of the given shapes to a `pyqsa serve` one shape at a time (N prompts of T random
tokens at once, 8 tokens each), and prints nvidia-smi's figure for the server's process after
each: a figure that moves names the first shape that made CUDA allocate memory outside the
ledger (a kernel module a library loads on demand, a workspace, a stack).

    python bench/smi_probe.py URL --pid SERVER_PID [--shapes 1x1000,1x2112,8x6000]

One line a shape: `NxT seconds MiB` (MiB is "-" where nvidia-smi lists no such process, as on a
CPU machine); exit status 1 when a request failed."""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from pyqsa.bench.mission import attempt, prompts
from pyqsa.bench.smi import smi_read

# single prompts past the 2048-token prefill pass, whose second pass has the remainder's
# columns, then prompts of several slots at once
DEFAULT_SHAPES = (
    "1x1000,1x1000,"
    + ",".join(
        f"1x{2048 + r}"
        for r in (
            1,
            16,
            64,
            100,
            128,
            200,
            256,
            300,
            384,
            452,
            500,
            640,
            768,
            1000,
            1024,
            1500,
            2000,
        )
    )
    + ",8x3000,8x6000"
)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'1x1000,8x6000' -> [(1, 1000), (8, 6000)]: requests at once x prompt tokens."""
    shapes = []
    for item in text.split(","):
        n, sep, tokens = item.strip().partition("x")
        if not (sep and n.isdigit() and tokens.isdigit() and int(n) > 0 and int(tokens) > 0):
            raise argparse.ArgumentTypeError(f"a shape is REQUESTSxTOKENS, got {item!r}")
        shapes.append((int(n), int(tokens)))
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, required=True, help="the server's process id")
    ap.add_argument(
        "--shapes",
        type=parse_shapes,
        default=DEFAULT_SHAPES,
        help="REQUESTSxTOKENS,... in order (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    try:
        model = httpx.get(f"{args.url}/v1/models", timeout=30).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        ap.error(f"no pyqsa server's models at {args.url}/v1/models: {e!r}")
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"

    def mib() -> str:
        read = smi_read(args.pid, gpu)
        return "-" if read is None or read[0] is None else str(read[0])

    print(f"start {mib()}", flush=True)
    failed = False
    for seed, (n, tokens) in enumerate(args.shapes):
        t0 = time.perf_counter()
        batch = prompts(n, tokens, seed)
        with ThreadPoolExecutor(n) as pool:
            runs = list(pool.map(lambda p: attempt(args.url, model, p, 8), batch))
        errors = [r["error"] for r in runs if "error" in r]
        failed |= bool(errors)
        # nvidia-smi's figure lags an allocation by up to a second
        time.sleep(1.5)
        print(f"{n}x{tokens} {time.perf_counter() - t0:.1f} {mib()}", *errors, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
