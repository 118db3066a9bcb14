"""Fakes for the engine unit tests: a scripted runner and vocabulary, an event collector."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

from pyqsa.engine import Delta, Event, Finished
from pyqsa.engine.runner import RunnerAborted
from pyqsa.engine.scheduler import Chunk

N_VOCAB = 64
EOS = 63


BYTES_PER_TOKEN = 100


class FakeRunner:
    """Greedy next token = last token + 1 (mod N_VOCAB); records batches and releases; its
    ledger counts BYTES_PER_TOKEN per cached token, as a paging backend would count KV. A pass
    whose hook returns with an abort requested ends in RunnerAborted."""

    def __init__(self, hook: Callable[[Sequence[Chunk]], None] | None = None) -> None:
        self.n_vocab = N_VOCAB
        self.samples_on_device = False
        self.batches: list[list[tuple[int, int, tuple[int, ...]]]] = []
        self.released: list[int] = []
        self.hook = hook
        self.cached: dict[int, int] = {}  # slot -> tokens in its cache
        self.abort = threading.Event()  # set by request_abort, cleared by clear_abort
        self.aborted = 0  # passes that ended in RunnerAborted
        self.restored: list[tuple[int, int]] = []  # (slot, tokens) of each restore

    def run(self, chunks: Sequence[Chunk], draws=None, on_launch=None) -> np.ndarray:
        if on_launch:
            on_launch()
        self.batches.append([(c.lease.slot, c.start, c.tokens) for c in chunks])
        for c in chunks:
            self.cached[c.lease.slot] = c.start + len(c.tokens)
        if self.hook:
            self.hook(chunks)
        if self.abort.is_set():
            self.aborted += 1
            raise RunnerAborted("aborted")
        rows = []
        for c in chunks:
            if c.sample:
                row = np.zeros(N_VOCAB, np.float32)
                row[(c.tokens[-1] + 1) % N_VOCAB] = 10.0
                rows.append(row)
        return np.array(rows, np.float32).reshape(len(rows), N_VOCAB)

    def release(self, slot: int) -> None:
        self.released.append(slot)
        self.cached.pop(slot, None)

    def snapshot(self, slot: int) -> bytes:
        """BYTES_PER_TOKEN bytes per cached token: the state's length says what it holds."""
        return bytes(BYTES_PER_TOKEN * self.cached.get(slot, 0))

    def restore(self, slot: int, state: bytes) -> None:
        self.cached[slot] = len(state) // BYTES_PER_TOKEN
        self.restored.append((slot, self.cached[slot]))

    def request_abort(self) -> None:
        self.abort.set()

    def clear_abort(self) -> None:
        self.abort.clear()

    def ledger(self) -> dict[str, int]:
        return {"weights": 5000, "kv": BYTES_PER_TOKEN * sum(self.cached.values())}

    def paging_stats(self) -> dict[str, int] | None:
        return None

    def paging_layers(self) -> dict[int, tuple[int, int]] | None:
        return None


class FakeVocab:
    def __init__(self, pieces: dict[int, bytes] | None = None) -> None:
        self.pieces = pieces or {}

    def token_bytes(self, token: int) -> bytes:
        return self.pieces.get(token, f"<{token}>".encode())

    def is_eog(self, token: int) -> bool:
        return token == EOS


class Collector:
    """A sink that keeps a request's events and says when it finished."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.seen: list[Event] = []
        self.first = threading.Event()

    def __call__(self, ev: Event) -> None:
        self.events.put(ev)
        self.first.set()

    def wait(self, timeout: float = 10.0) -> Finished:
        while True:
            ev = self.events.get(timeout=timeout)
            self.seen.append(ev)
            if isinstance(ev, Finished):
                return ev

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.seen)

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.seen if isinstance(e, Delta) for t in e.token_ids]
