"""The hot-cache paging policy (PYQSA_GGML_OP_QSA_PAGE_RESOLVE) against a Python model of it.

The model is the policy as documented in native/include/pyqsa-ggml.h: per stream, a selected
block that is resident is a hit and pins its slot for the step; the distinct missed blocks, in
increasing order, each take the unpinned slot used least recently (never-used slots first,
the lowest slot on ties). `test-qsa-page trace` runs the native CPU op on the same scenario.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass, field

import pytest

from pyqsa._build.native import BuildConfig


@dataclass
class HotCache:
    """One stream's hot cache of `slots` blocks."""

    slots: int
    owner: list[int] = field(default_factory=list)  # slot -> block, -1 free
    last_use: list[int] = field(default_factory=list)  # slot -> step, -1 never
    where: dict[int, int] = field(default_factory=dict)  # resident block -> slot
    hits: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        self.owner = [-1] * self.slots
        self.last_use = [-1] * self.slots

    def step(self, step: int, queries: list[tuple[int, list[int]]]) -> list[int]:
        """queries: (n_vis, selected blocks) each; returns the slot of every entry, -1 where
        the block is not visible."""
        missed = set()
        for n_vis, blocks in queries:
            for b in blocks:
                if b >= n_vis:
                    continue
                if b in self.where:
                    self.last_use[self.where[b]] = step
                    self.hits += 1
                else:
                    missed.add(b)
        for b in sorted(missed):
            free = [s for s in range(self.slots) if self.last_use[s] != step]
            victim = min(free, key=lambda s: (self.last_use[s], s))
            self.where.pop(self.owner[victim], None)
            self.owner[victim], self.last_use[victim] = b, step
            self.where[b] = victim
            self.misses += 1
        return [self.where[b] if b < n_vis else -1 for n_vis, blocks in queries for b in blocks]


def trace(ns: int, slots: int, n_blocks: int, kb: int, n_q: int, steps) -> list[list[tuple]]:
    """Runs the native op on the CPU; per step and stream: (out, owner, (hits, misses))."""
    binary = BuildConfig.from_env().build_dir / "bin" / "test-qsa-page"
    assert binary.exists(), f"{binary} missing: the build did not make test-qsa-page"
    lines = [f"{ns} {slots} {n_blocks} {kb} {n_q} {len(steps)}"]
    for number, per_stream in steps:
        lines.append(str(number))
        for queries in per_stream:
            for n_vis, blocks in queries:
                lines.append(" ".join(map(str, [n_vis, *blocks])))
    proc = subprocess.run(
        [str(binary), "trace"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    out = []
    for t in range(len(steps)):
        per = []
        for s in range(ns):
            o, w, st = rows[3 * (t * ns + s) : 3 * (t * ns + s) + 3]
            per.append(
                (
                    [int(x) for x in o.split()[1:]],
                    [int(x) for x in w.split()[1:]],
                    tuple(int(x) for x in st.split()[1:]),
                )
            )
        out.append(per)
    return out


def test_hit_miss_eviction_sequence_as_specified():
    cache = HotCache(3)
    assert cache.step(1, [(10, [0, 1])]) == [0, 1]  # two misses fill free slots 0, 1
    assert cache.step(2, [(10, [1, 2])]) == [1, 2]  # 1 hits; 2 takes the last free slot
    assert cache.step(3, [(10, [1, 3])]) == [1, 0]  # 3 evicts block 0 (slot 0, used at step 1)
    assert cache.step(4, [(10, [4, 5])]) == [2, 0]  # slot 2 (step 2), then slot 0 (tie: lower)
    assert cache.step(5, [(4, [0, 3, 7])]) == [1, 0, -1]  # 7 is past n_vis: not selected
    assert (cache.hits, cache.misses) == (2, 8)
    assert cache.owner == [3, 0, 4]


@pytest.mark.parametrize("ns,slots,n_blocks,kb,n_q", [(2, 6, 30, 3, 2), (1, 64, 500, 32, 1)])
def test_native_op_follows_the_policy(ns, slots, n_blocks, kb, n_q):
    rng = random.Random(ns * 1000 + slots)
    steps = []
    for t in range(60):
        per_stream = []
        for _ in range(ns):
            queries = []
            for _ in range(n_q):
                n_vis = min(n_blocks, kb + t * n_blocks // 60)
                near = list(range(max(0, n_vis - 3 * kb), n_vis))
                chosen = set()
                while len(chosen) < min(kb, n_vis):
                    chosen.add(rng.choice(near) if rng.random() < 0.7 else rng.randrange(n_vis))
                pad = n_vis
                while len(chosen) < kb:
                    chosen.add(pad)
                    pad += 1
                queries.append((n_vis, sorted(chosen)))
            per_stream.append(queries)
        steps.append((2 * t + 5, per_stream))

    native = trace(ns, slots, n_blocks, kb, n_q, steps)
    models = [HotCache(slots) for _ in range(ns)]
    for t, (number, per_stream) in enumerate(steps):
        for s, queries in enumerate(per_stream):
            m = models[s]
            out = m.step(number, queries)
            assert native[t][s] == (out, m.owner, (m.hits, m.misses)), (t, s)
    assert all(m.misses > slots and m.hits > 0 for m in models)  # the run really evicted
