#!/usr/bin/env python3
"""Write uncommitted edits in the patched tree as a patch of the series.

    python ggml_patches/regen.py NNNN-what.patch            # new patch at the end
    python ggml_patches/regen.py --replace NNNN-what.patch  # fold edits into the last patch
    (--tree TREE, default .build/llama.cpp)

Workflow: apply.py, edit files in the tree, regen.py, rebuild.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyqsa._build import patches, upstream  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--replace", action="store_true")
    ap.add_argument("--tree", type=Path, default=upstream.ROOT / ".build" / "llama.cpp")
    args = ap.parse_args()
    try:
        out = patches.regenerate(args.tree, args.name, replace_last=args.replace)
    except patches.PatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
