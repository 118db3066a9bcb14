"""Two GPUs against one: the same requests through the engine with the layers on GPU 0 alone
(`--gpus 0`) and split over GPUs 0 and 1 (`--gpus 0,1`), 1 and 8 slots at once, unpaged and
paged (`--hot-blocks`), greedy, each run in a process of its own (tests/gpu/fast_path.py's).
Each layer runs the same kernels on either card, so tokens and log-probabilities must be the
same bit for bit.

    python tests/gpu/two_gpus.py [MODEL] [--steps 256] [--hot-blocks 16]
        (default MODEL: the embedded demo; exit status 1 when a run differs, 2 with fewer than
        two GPUs)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.fast_path import compare, described, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--hot-blocks", type=int, default=16)
    ap.add_argument("--slots", default="1,8")
    a = ap.parse_args(argv)
    from pyqsa.engine.paging import gpu_devices

    if len(gpu_devices()) < 2:
        print(f"two_gpus.py: {len(gpu_devices())} GPU(s) here, two needed", file=sys.stderr)
        return 2
    if a.model is None:
        from pyqsa.demo_model import demo_model_path

        a.model = str(demo_model_path())
    status = 0
    for n_slots in (int(s) for s in a.slots.split(",")):
        for hot_blocks in (0, a.hot_blocks):
            one, two = (
                run(a.model, n_slots, a.steps, 999, {}, {"gpus": gpus, "hot_blocks": hot_blocks})
                for gpus in ([0], [0, 1])
            )
            res = compare(one, two)
            status |= not res["identical"]
            kv = f"paged, {hot_blocks} hot blocks" if hot_blocks else "unpaged"
            ok = "OK" if res["identical"] else "FAIL"
            print(f"{n_slots} slot(s), {kv}: two GPUs vs one: {described(res)}: {ok}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
