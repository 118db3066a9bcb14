"""Slot leases: which request owns which sequence of the model's memory, and since when.

A slot is one sequence (seq_id = slot index) of the llama context. A request holds it through
a `SlotLease` stamped with the slot's generation; `release` bumps the generation, so a batch
result or a write that carries an older lease is recognised as stale and dropped. The
scheduler treats leases as opaque tokens; what a slot owns (today a llama.cpp sequence, later
paged KV regions) is freed by the `on_release` hook the table was built with.
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
    """Fixed set of slots, leased lowest index first."""

    def __init__(self, n_slots: int, capacity: int, on_release: Callable[[int], None]) -> None:
        self._capacity = capacity
        self._generation = [0] * n_slots
        self._owner: list[SlotLease | None] = [None] * n_slots
        self._on_release = on_release

    @property
    def n_slots(self) -> int:
        return len(self._owner)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def busy(self) -> int:
        return sum(o is not None for o in self._owner)

    def acquire(self) -> SlotLease | None:
        """Lease the lowest free slot, or None when all are busy."""
        for slot, owner in enumerate(self._owner):
            if owner is None:
                lease = SlotLease(slot, self._generation[slot], self._capacity)
                self._owner[slot] = lease
                return lease
        return None

    def is_current(self, lease: SlotLease) -> bool:
        return self._owner[lease.slot] == lease

    def release(self, lease: SlotLease) -> bool:
        """Free the slot and everything it owns. A stale lease changes nothing (returns False)."""
        if not self.is_current(lease):
            return False
        self._owner[lease.slot] = None
        self._generation[lease.slot] += 1
        self._on_release(lease.slot)
        return True
