"""The prefix cache: states of token prefixes that slots held, kept in host memory, so a request
whose prompt starts with one starts from that state and prefills only the rest.

An entry is a snapshot of one slot's sequence at the length it had when taken: its head (the
Gated DeltaNet recurrent and conv states, cell metadata, the tail block's ring rows) and the row
segments (prefix_rows.py: the QSA layers' K/V, the indexer's keys) covering its positions. The
recurrent state cannot be rewound, so an entry can only be resumed at exactly its own length: the
engine takes snapshots where prompts end (a finished reply is computed again as a prompt for it,
see prefix_reuse.py) and every `stride` tokens inside long prompts, and a prompt reuses the
longest entry that is a prefix of it. Because the tail block is saved with it, an entry may end
anywhere, not only on a block boundary.

NOTE: the lookup structure. Entries exist only at those few snapshot lengths, not at every
block, so each entry is keyed by its length and a 64-bit polynomial hash of its tokens; a
prompt's prefix hashes at every length come from one vectorized pass (numpy, wrapping uint64
arithmetic: 13 ms for a 256K-token prompt given as a Python list, on the 2-core dev machine,
against 38 ms for a chain of per-block tuple hashes in Python), once per request (`Tokens`: its
lookups and its snapshots use them), then each distinct entry length is one dict probe, longest
first (a 256K prompt against 100 entries: 10 ms). A hit is confirmed
by comparing the tokens, so a hash collision costs a miss, never a wrong state. A radix tree
would find the longest common prefix at any token, which a state that cannot be rewound has no
use for.

Entries are read-only and counted: a request holds the entry it started from until it ends, and
eviction (least recently used first, whole entries) never takes one that is held. Entries share
row segments (the snapshots of one sequence at several lengths): a segment's bytes count once,
and go when the last entry holding it does. An entry that does not fit the budget beside the held
ones is not kept.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .prefix_rows import HeadFill, RowSegment

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: every power is a unit mod 2**64
# the default budget: this share of the host memory available (MemAvailable) beside the paging
# host store, which the cache must not crowd out
DEFAULT_HOST_SHARE = 0.2
DEFAULT_BUDGET_UNKNOWN_HOST = 1 << 30  # where MemAvailable cannot be read


_powers = np.ones(1, np.uint64)  # _HASH_BASE ** i, grown as needed


def _powers_below(n: int) -> np.ndarray:
    """uint64 [n]: _HASH_BASE ** i at i."""
    global _powers
    if len(_powers) < n:
        grown = np.full(max(n, 2 * len(_powers)), _HASH_BASE, np.uint64)
        grown[0] = 1
        _powers = np.cumprod(grown, dtype=np.uint64)
    return _powers[:n]


def prefix_hashes(tokens: np.ndarray, start: int = 0, base: int = 0) -> np.ndarray:
    """uint64 [n]: the hash of tokens[:i + 1] at i; of tokens that follow `start` others whose
    hash is `base`, the hashes of the whole at start + i."""
    powers = _powers_below(start + len(tokens))[start:]
    with np.errstate(over="ignore"):
        terms = (tokens.astype(np.uint64) + 1) * powers
        return np.cumsum(terms, dtype=np.uint64) + np.uint64(base)


class Tokens:
    """A token sequence and its prefix hashes, computed once for every lookup and insert of its
    prefixes (a request's prompt: the lookups where it starts, the snapshots as it is computed)."""

    def __init__(self, tokens: Sequence[int] | np.ndarray) -> None:
        self.array = np.asarray(tokens, np.int64)
        self._hashes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.array)

    def hash(self, n: int) -> int:
        """The hash of the first n tokens (n >= 1)."""
        return int(self.hashes()[n - 1])

    def hashes(self) -> np.ndarray:
        if self._hashes is None:
            self._hashes = prefix_hashes(self.array)
        return self._hashes

    def extended(self, more: Sequence[int]) -> Tokens:
        """These tokens followed by `more`, its hashes made from these ones: the cost of `more`,
        not of a conversion and a hash of the whole (a reply after a 200K-token prompt)."""
        tail = np.asarray(more, np.int64)
        out = Tokens(np.concatenate((self.array, tail)))
        if len(self):
            h = self.hashes()
            out._hashes = np.concatenate((h, prefix_hashes(tail, len(self), int(h[-1]))))
        return out


def _tokens(t: Sequence[int] | Tokens) -> Tokens:
    return t if isinstance(t, Tokens) else Tokens(t)


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
    head: bytes | np.ndarray  # Runner.snapshot's head of a slot holding exactly these tokens
    segments: tuple[RowSegment, ...] = ()  # its rows, positions 0..n-1 in order
    refs: int = 0  # requests started from it and still running
    fill: HeadFill | None = None  # the head's copy when staged (None: whole)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Its own bytes, without the segments (which entries share)."""
        return len(self.head) + self.tokens.nbytes


class PrefixCache:
    """Entries by (length, hash), least recently used first, within `budget` bytes."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        self.budget = budget
        self.bytes = 0  # held by the entries and their segments
        self.evicted = 0  # entries evicted for room, since start
        self._entries: OrderedDict[tuple[int, int], PrefixEntry] = OrderedDict()
        self._lengths: list[int] = []  # of the entries, sorted (one per entry)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[PrefixEntry]:
        """Least recently used first."""
        return list(self._entries.values())

    def match(self, prompt: Sequence[int] | Tokens, limit: int | None = None) -> PrefixEntry | None:
        """The longest entry that is a prefix of `prompt`, at least two tokens shorter and at most
        `limit` long, held for the caller (give it back with `release`). A request computes at
        least its last prompt token, and never that one alone: a one-token pass rounds
        differently from a chunk's (see Scheduler._no_lone_last_tokens)."""
        found = self._find(prompt, limit)
        if found is None:
            return None
        key, entry = found
        self._entries.move_to_end(key)
        entry.refs += 1
        return entry

    def longest(
        self,
        prompt: Sequence[int] | Tokens,
        limit: int | None = None,
        accept: Callable[[PrefixEntry], bool] | None = None,
    ) -> int:
        """The length of the entry `match` would give (of those `accept` takes), 0 for none;
        neither held nor touched."""
        found = self._find(prompt, limit, accept)
        return 0 if found is None else found[1].n_tokens

    def _find(
        self,
        prompt: Sequence[int] | Tokens,
        limit: int | None,
        accept: Callable[[PrefixEntry], bool] | None = None,
    ) -> tuple[tuple[int, int], PrefixEntry] | None:
        t = _tokens(prompt)
        top = len(t) - 2 if limit is None else min(limit, len(t) - 2)
        end = bisect_left(self._lengths, top + 1)  # entries of <= top tokens
        tried = None
        for n in reversed(self._lengths[:end]):
            if n == tried:
                continue
            tried = n
            key = (n, t.hash(n))
            entry = self._entries.get(key)
            if entry is not None and np.array_equal(entry.tokens, t.array[:n]):
                if accept is None or accept(entry):
                    return key, entry
        return None

    def release(self, entry: PrefixEntry) -> None:
        assert entry.refs > 0
        entry.refs -= 1

    def get(self, tokens: Sequence[int] | Tokens, n: int | None = None) -> PrefixEntry | None:
        """The entry of exactly the first n (default: all) of these tokens, if any (not held)."""
        t = _tokens(tokens)
        n = len(t) if n is None else n
        entry = self._entries.get((n, t.hash(n))) if n else None
        return entry if entry is not None and np.array_equal(entry.tokens, t.array[:n]) else None

    def contains(self, tokens: Sequence[int] | Tokens, n: int | None = None) -> bool:
        return self.get(tokens, n) is not None

    def insert(
        self,
        tokens: Sequence[int] | Tokens,
        head: bytes | np.ndarray,
        segments: Sequence[RowSegment] = (),
        n: int | None = None,
        fill: HeadFill | None = None,
    ) -> bool:
        """Keep `head` and `segments` as the state of the first n (default: all) of `tokens`
        (`fill`: the head's copy, when it is staged), evicting the least recently used entries
        not held; False (nothing kept) when it does not fit or an entry of these tokens exists."""
        t = _tokens(tokens)
        n = len(t) if n is None else n
        if not n or (n, t.hash(n)) in self._entries:
            return False
        entry = PrefixEntry(t.array[:n].copy(), head, tuple(segments), fill=fill)
        if not self._fits(entry):
            return False
        for seg in entry.segments:
            if seg.refs == 0:
                self.bytes += seg.nbytes
            seg.refs += 1
        self._entries[(n, t.hash(n))] = entry
        insort(self._lengths, entry.n_tokens)
        self.bytes += entry.nbytes
        for k in [k for k, e in self._entries.items() if e.refs == 0 and e is not entry]:
            if self.bytes <= self.budget:
                break
            self._drop(k)
            self.evicted += 1
        return True

    def _fits(self, entry: PrefixEntry) -> bool:
        """Whether `entry` fits beside the held entries (every other one evicted)."""
        held = [e for e in self._entries.values() if e.refs] + [entry]
        segments = {id(s): s for e in held for s in e.segments}
        need = sum(e.nbytes for e in held) + sum(s.nbytes for s in segments.values())
        return need <= self.budget

    def _drop(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key)
        del self._lengths[bisect_left(self._lengths, entry.n_tokens)]
        self.bytes -= entry.nbytes
        for seg in entry.segments:
            seg.refs -= 1
            if seg.refs == 0:
                self.bytes -= seg.nbytes
                seg.drop()

    def clear(self) -> None:
        """Drop every entry not held (the held ones go once released and evicted)."""
        for key in [k for k, e in self._entries.items() if e.refs == 0]:
            self._drop(key)
