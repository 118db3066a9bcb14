"""Continuous batching: which tokens of which requests go into the next step.

Each step has a token budget. Requests whose cache is one token behind (decode) go first, one
token each, so running requests never stall; the rest of the budget is filled with prompt
chunks, oldest request first. A long prompt therefore takes several steps and interleaves
with everyone else's decode.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .request import Request, RequestState
from .slots import SlotLease, SlotTable


@dataclass(frozen=True)
class Chunk:
    """`tokens` of `request` at positions `start`.. on the lease's sequence."""

    request: Request
    lease: SlotLease
    start: int
    tokens: tuple[int, ...]

    @property
    def sample(self) -> bool:
        """True when the chunk reaches the last known token: its last row yields a new token."""
        return self.start + len(self.tokens) == len(self.request.tokens)


class Scheduler:
    def __init__(self, slots: SlotTable, max_batch_tokens: int) -> None:
        self.slots = slots
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def finish(self, req: Request) -> None:
        """Take `req` out of the queue or its slot, releasing the lease. Idempotent."""
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
        elif req.state is RequestState.RUNNING:
            self.running.remove(req)
            assert req.lease is not None
            self.slots.release(req.lease)
        req.state = RequestState.FINISHED

    def schedule(self) -> list[Chunk]:
        """Admit waiting requests into free slots, then plan one step within the budget."""
        while self.waiting:
            lease = self.slots.acquire()
            if lease is None:
                break
            req = self.waiting.popleft()
            req.lease, req.state = lease, RequestState.RUNNING
            self.running.append(req)

        budget = self.max_batch_tokens
        chunks: list[Chunk] = []
        for req in self.running:  # decode first
            if req.num_pending == 1 and budget > 0:
                chunks.append(self._chunk(req, 1))
                budget -= 1
        for req in self.running:  # then prompt chunks, oldest first
            if req.num_pending > 1 and budget > 0:
                n = min(req.num_pending, budget)
                chunks.append(self._chunk(req, n))
                budget -= n
        return chunks

    @staticmethod
    def _chunk(req: Request, n: int) -> Chunk:
        assert req.lease is not None
        start = req.num_computed_tokens
        return Chunk(req, req.lease, start, tuple(req.tokens[start : start + n]))
