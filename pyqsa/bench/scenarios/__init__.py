"""The scenarios of `pyqsa bench`, each measured and reported on its own.

Every scenario module has SIZES (its shape per preset: "quick", small enough for a CPU in a
minute or two; "cpu", the demo model on a CPU; "gpu", the full-shape model on a GPU) and
`run(bench) -> dict`, the result document of record.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

SCENARIOS = ("steps", "server", "capacity", "long", "prefix")
PRESETS = ("quick", "cpu", "gpu")


@dataclass(frozen=True)
class Bench:
    """What every scenario runs with."""

    model: Path
    preset: str  # one of PRESETS
    work: Path  # a folder for logs and the scenarios' intermediate files
    threads: int | None = None  # CPU threads of decode.py and the servers (None: their default)
    repeats: int | None = None  # None: the preset's
    upstream_lib: Path | None = None  # steps: an unpatched llama.cpp's libllama.so folder
    # where a scenario of many runs (steps) writes its document as it goes, marked "partial",
    # so a run cut short (a machine's time limit) keeps what it measured; None: only at the end
    out: Path | None = None

    def size(self, sizes: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The scenario's shape for this preset, with --repeats applied."""
        shape = dict(sizes[self.preset])
        if self.repeats is not None and "repeats" in shape:
            shape["repeats"] = self.repeats
        return shape

    def thread_flags(self) -> list[str]:
        return ["--threads", str(self.threads)] if self.threads else []

    def progress(self, total: int, desc: str, unit: str = "run") -> tqdm:
        """A progress bar on stderr, left in place when done."""
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def run(name: str, bench: Bench) -> dict[str, Any]:
    """The scenario `name`'s result document."""
    from . import capacity, long, prefix, server, steps

    module = {"steps": steps, "server": server, "capacity": capacity, "long": long}
    return {**module, "prefix": prefix}[name].run(bench)
