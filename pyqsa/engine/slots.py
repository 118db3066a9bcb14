"""Slot leases: which request owns which sequence of the model's memory, and since when.

A slot is one sequence (seq_id = slot index) of the llama context. A request holds it through
a `SlotLease` stamped with the slot's generation; `release` bumps the generation, so a batch
result or a write that carries an older lease is recognised as stale and dropped. The
scheduler treats leases as opaque tokens; what a slot owns (a llama.cpp sequence) is freed by
the `on_release` hook the table was built with.

A slot released with `keep` holds its sequence on while free (the prefix cache's in-place reuse:
a follow-up that starts with it continues there). A request asking for no slot in particular
gets the lowest free slot that holds nothing, else the one whose sequence was released longest
ago (least recently used), emptied first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotLease:
    slot: int
    generation: int
    capacity: int  # tokens the slot holds (prompt + output)


class SlotTable:
    """Fixed set of slots; free ones may hold their last sequence (`keep`)."""

    def __init__(self, n_slots: int, capacity: int, on_release: Callable[[int], None]) -> None:
        self._capacity = capacity
        self._generation = [0] * n_slots
        self._owner: list[SlotLease | None] = [None] * n_slots
        self._on_release = on_release
        self._held: dict[int, int] = {}  # free slot holding its sequence -> when released
        self._releases = 0

    @property
    def n_slots(self) -> int:
        return len(self._owner)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def busy(self) -> int:
        return sum(o is not None for o in self._owner)

    def held(self) -> list[int]:
        """The free slots holding their sequence, least recently released first."""
        return sorted(self._held, key=self._held.__getitem__)

    def acquire(self, prefer: int | None = None) -> SlotLease | None:
        """Lease `prefer` when free, with what it holds; else the lowest free slot that holds
        nothing, else the least recently released one, emptied; None when all are busy."""
        free = [slot for slot, owner in enumerate(self._owner) if owner is None]
        if not free:
            return None
        if prefer in free:
            slot = prefer
        else:
            empty = [s for s in free if s not in self._held]
            slot = empty[0] if empty else self.held()[0]
            if slot in self._held:
                self.drop(slot)
        self._held.pop(slot, None)
        lease = SlotLease(slot, self._generation[slot], self._capacity)
        self._owner[slot] = lease
        return lease

    def is_current(self, lease: SlotLease) -> bool:
        return self._owner[lease.slot] == lease

    def release(self, lease: SlotLease, keep: bool = False) -> bool:
        """Free the slot, and everything it owns unless `keep`. A stale lease changes nothing
        (returns False)."""
        if not self.is_current(lease):
            return False
        self._owner[lease.slot] = None
        self._generation[lease.slot] += 1
        if keep:
            self._releases += 1
            self._held[lease.slot] = self._releases
        else:
            self._on_release(lease.slot)
        return True

    def drop(self, slot: int) -> None:
        """Empty a free slot that holds its sequence."""
        if self._held.pop(slot, None) is not None:
            self._on_release(slot)
