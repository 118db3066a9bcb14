#!/usr/bin/env python3
"""Apply the patch series to a fresh extract of the pinned upstream.

    python ggml_patches/apply.py [TREE]     # default TREE: .build/llama.cpp

TREE becomes a git repository: tag `upstream` is the pristine tree, one commit per patch.
Exits non-zero, naming the patch, when one does not apply.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyqsa._build import patches, upstream  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = upstream.ROOT / ".build" / "llama.cpp"
    ap.add_argument("tree", nargs="?", type=Path, default=default, help=f"default {default}")
    tree = ap.parse_args().tree
    try:
        extract = upstream.fetch()
        patches.init_tree(extract / "vendor" / "llama.cpp", tree)
        changed = patches.apply_series(tree)
    except (upstream.UpstreamError, patches.PatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    n = len(patches.series())
    print(f"{tree}: {n} patches {'applied' if changed else 'already applied'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
