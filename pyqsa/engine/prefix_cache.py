"""The prefix cache: states of token prefixes that slots held, kept in host memory, so a request
whose prompt starts with one starts from that state and prefills only the rest.

An entry is a snapshot of one slot's sequence (`Runner.snapshot`: the QSA layers' K/V, the
indexer's block keys and the raw keys of the incomplete tail block, the Gated DeltaNet recurrent
and conv states) at the length it had when taken. The recurrent state cannot be rewound, so an
entry can only be resumed at exactly its own length: the engine takes snapshots where prompts
end (a finished reply is computed again as a prompt for it, see prefix_reuse.py) and every
`stride` tokens inside long prompts, and a prompt reuses the longest entry that is a prefix of
it. Because the tail block is saved with it, an entry may end anywhere, not only on a block
boundary.

NOTE: the lookup structure. Entries exist only at those few snapshot lengths, not at every
block, so each entry is keyed by its length and a 64-bit polynomial hash of its tokens; a
prompt's prefix hashes at every length come from one vectorized pass (numpy, wrapping uint64
arithmetic: 13 ms for a 256K-token prompt given as a Python list, on the 2-core dev machine,
against 38 ms for a chain of per-block tuple hashes in Python), then each distinct entry length
is one dict probe, longest first (a 256K prompt against 100 entries: 10 ms). A hit is confirmed
by comparing the tokens, so a hash collision costs a miss, never a wrong state. A radix tree
would find the longest common prefix at any token, which a state that cannot be rewound has no
use for.

Entries are read-only and counted: a request holds the entry it started from until it ends, and
eviction (least recently used first, whole entries) never takes one that is held. An entry that
does not fit the budget beside the held ones is not kept.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: every power is a unit mod 2**64
# the default budget: this share of the host memory available (MemAvailable) beside the paging
# host store, which the cache must not crowd out
DEFAULT_HOST_SHARE = 0.2
DEFAULT_BUDGET_UNKNOWN_HOST = 1 << 30  # where MemAvailable cannot be read


def budget(gib: float | None, free_host: int | None, reserved: int) -> int:
    """The cache's budget in bytes: `gib` GiB (None: DEFAULT_HOST_SHARE of the host memory
    `free_host` less `reserved`, the bytes a paging host store takes). ValueError for a budget
    that is negative, not finite, or more than that memory (None: unknown, not checked)."""
    left = None if free_host is None else max(0, free_host - reserved)
    if gib is None:
        return DEFAULT_BUDGET_UNKNOWN_HOST if left is None else int(DEFAULT_HOST_SHARE * left)
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"{gib} is not a size in GiB (a number >= 0; 0 turns the cache off)")
    n = int(gib * 2**30)
    if left is not None and n > left:
        raise ValueError(
            f"{gib} GiB is more than the {left / 2**30:.2f} GiB of host memory available"
            + (" beside the paging host store" if reserved else "")
            + " (MemAvailable)"
        )
    return n


@dataclass(eq=False)
class PrefixEntry:
    tokens: np.ndarray  # int64 [n]: the prefix
    state: bytes | bytearray  # Runner.snapshot of a slot holding exactly these tokens
    refs: int = 0  # requests started from it and still running

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return len(self.state) + self.tokens.nbytes


class PrefixCache:
    """Entries by (length, hash), least recently used first, within `budget` bytes."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        self.budget = budget
        self.bytes = 0  # held by the entries
        self.evicted = 0  # entries evicted for room, since start
        self._entries: OrderedDict[tuple[int, int], PrefixEntry] = OrderedDict()
        self._lengths: list[int] = []  # of the entries, sorted (one per entry)
        self._powers = np.ones(1, np.uint64)

    def __len__(self) -> int:
        return len(self._entries)

    def _prefix_hashes(self, tokens: np.ndarray) -> np.ndarray:
        """uint64 [n]: hash of tokens[:i + 1] at i."""
        n = len(tokens)
        if len(self._powers) < n:
            grown = np.full(max(n, 2 * len(self._powers)), _HASH_BASE, np.uint64)
            grown[0] = 1
            self._powers = np.cumprod(grown, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return np.cumsum((tokens.astype(np.uint64) + 1) * self._powers[:n], dtype=np.uint64)

    def _key(self, tokens: np.ndarray) -> tuple[int, int]:
        return len(tokens), int(self._prefix_hashes(tokens)[-1])

    def match(self, prompt: Sequence[int]) -> PrefixEntry | None:
        """The longest entry that is a prefix of `prompt` and at least two tokens shorter, held
        for the caller (give it back with `release`). A request computes at least its last
        prompt token, and never that one alone: a one-token pass rounds differently from a
        chunk's (see Scheduler._no_lone_last_tokens)."""
        found = self._find(prompt)
        if found is None:
            return None
        key, entry = found
        self._entries.move_to_end(key)
        entry.refs += 1
        return entry

    def longest(self, prompt: Sequence[int]) -> int:
        """The length of the entry `match` would give, 0 for none; neither held nor touched."""
        found = self._find(prompt)
        return 0 if found is None else found[1].n_tokens

    def _find(self, prompt: Sequence[int]) -> tuple[tuple[int, int], PrefixEntry] | None:
        tokens = np.asarray(prompt, np.int64)
        end = bisect_left(self._lengths, len(tokens) - 1)  # entries of <= len - 2 tokens
        if end == 0:
            return None
        hashes = self._prefix_hashes(tokens[: self._lengths[end - 1]])
        tried = None
        for n in reversed(self._lengths[:end]):
            if n == tried:
                continue
            tried = n
            key = (n, int(hashes[n - 1]))
            entry = self._entries.get(key)
            if entry is not None and np.array_equal(entry.tokens, tokens[:n]):
                return key, entry
        return None

    def release(self, entry: PrefixEntry) -> None:
        assert entry.refs > 0
        entry.refs -= 1

    def contains(self, tokens: Sequence[int]) -> bool:
        t = np.asarray(tokens, np.int64)
        entry = self._entries.get(self._key(t)) if len(t) else None
        return entry is not None and np.array_equal(entry.tokens, t)

    def insert(self, tokens: Sequence[int], state: bytes | bytearray) -> bool:
        """Keep `state` as the state of `tokens`, evicting the least recently used entries not
        held; False (nothing kept) when it does not fit or an entry of these tokens exists."""
        entry = PrefixEntry(np.array(tokens, np.int64), state)
        key = self._key(entry.tokens)
        if not entry.n_tokens or key in self._entries or not self._make_room(entry.nbytes):
            return False
        self._entries[key] = entry
        insort(self._lengths, entry.n_tokens)
        self.bytes += entry.nbytes
        return True

    def _make_room(self, nbytes: int) -> bool:
        free_able = sum(e.nbytes for e in self._entries.values() if e.refs == 0)
        if self.bytes - free_able + nbytes > self.budget:
            return False
        for key in [k for k, e in self._entries.items() if e.refs == 0]:
            if self.bytes + nbytes <= self.budget:
                break
            self._drop(key)
            self.evicted += 1
        return True

    def _drop(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key)
        del self._lengths[bisect_left(self._lengths, entry.n_tokens)]
        self.bytes -= entry.nbytes

    def clear(self) -> None:
        """Drop every entry not held (the held ones go once released and evicted)."""
        for key in [k for k, e in self._entries.items() if e.refs == 0]:
            self._drop(key)
