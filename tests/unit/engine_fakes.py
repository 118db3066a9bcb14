"""Fakes for the engine unit tests: a scripted runner and vocabulary, an event collector."""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

from pyqsa.engine import Delta, Event, Finished
from pyqsa.engine.runner import RunnerAborted
from pyqsa.engine.scheduler import Chunk

N_VOCAB = 64
EOS = 63


BYTES_PER_TOKEN = 100  # of a snapshot's rows
HEAD_BYTES = 64  # of a snapshot's head


def _head(tokens: Sequence[int]) -> bytes:
    """A fake head: the length and a digest of the tokens (the state they left behind)."""
    digest = hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).digest()
    return len(tokens).to_bytes(8, "little") + digest + bytes(HEAD_BYTES - 40)


class FakeRows:
    """A snapshot's rows: position p is BYTES_PER_TOKEN bytes starting with its token id. A copy
    waits for the runner's `copy_gate` and counts as reading the slot meanwhile. With the
    runner's `stage_heads`, the head it was saved with is zeros until `fill_head`, which waits
    for the runner's `fill_gate`."""

    def __init__(
        self, runner: FakeRunner, slot: int, tokens: list[int], head: bytearray | None = None
    ) -> None:
        self.runner, self.slot, self.tokens = runner, slot, tokens
        self._staged = head

    @property
    def head_staged(self) -> bool:
        return self._staged is not None

    def fill_head(self) -> None:
        head, self._staged = self._staged, None
        assert self.runner.fill_gate.wait(10)
        head[:] = _head(self.tokens)
        self.runner.filled += 1

    def size(self, start: int, end: int) -> int:
        return BYTES_PER_TOKEN * (end - start)

    def get(self, start: int, end: int) -> bytes:
        r = self.runner
        r.reading[self.slot] = (start, end)
        try:
            assert r.copy_gate.wait(10)
            return b"".join(
                t.to_bytes(8, "little") + bytes(BYTES_PER_TOKEN - 8) for t in self.tokens[start:end]
            )
        finally:
            del r.reading[self.slot]

    def close(self) -> None:
        self.runner.closed_sources += 1


class FakeRunner:
    """Greedy next token = last token + 1 (mod N_VOCAB); records batches, releases, restores
    and resumes; its ledger counts BYTES_PER_TOKEN per cached token, as a paging backend would
    count KV. It keeps each slot's tokens and records in `violations` every pass, load or
    release that finds a slot holding other tokens than its request's, or that writes a slot
    whose rows a copy is reading. A pass whose hook returns with an abort requested ends in
    RunnerAborted."""

    def __init__(self, hook: Callable[[Sequence[Chunk]], None] | None = None) -> None:
        self.n_vocab = N_VOCAB
        self.samples_on_device = False
        self.batches: list[list[tuple[int, int, tuple[int, ...]]]] = []
        self.released: list[int] = []
        self.hook = hook
        self.content: dict[int, list[int]] = {}  # slot -> the tokens in its cache
        self.abort = threading.Event()  # set by request_abort, cleared by clear_abort
        self.aborted = 0  # passes that ended in RunnerAborted
        self.restored: list[tuple[int, int]] = []  # (slot, tokens) of each restore
        self.resumed: list[tuple[int, int]] = []  # (slot, tokens) of each resume
        self.copy_gate = threading.Event()  # copies of rows wait for it
        self.copy_gate.set()
        self.reading: dict[int, tuple[int, int]] = {}  # slot -> the rows a copy reads now
        self.closed_sources = 0
        self.violations: list[str] = []
        self.stage_heads = False  # snapshots' heads are whole only after FakeRows.fill_head
        self.fill_gate = threading.Event()  # fills wait for it
        self.fill_gate.set()
        self.filled = 0
        self.opened = 0  # rows opened without a snapshot (copied ahead)

    @property
    def cached(self) -> dict[int, int]:
        return {slot: len(t) for slot, t in self.content.items()}

    def _writes(self, slot: int, start: int, what: str) -> None:
        reading = self.reading.get(slot)
        if reading is not None and start < reading[1]:
            self.violations.append(f"{what} wrote slot {slot} from {start} while copying {reading}")

    def run(self, chunks: Sequence[Chunk], draws=None, on_launch=None) -> np.ndarray:
        if on_launch:
            on_launch()
        self.batches.append([(c.lease.slot, c.start, c.tokens) for c in chunks])
        for c in chunks:
            have = self.content.setdefault(c.lease.slot, [])
            if have != c.request.tokens[: c.start]:
                self.violations.append(
                    f"slot {c.lease.slot} held {len(have)} other tokens at {c.request.request_id}"
                )
            self._writes(c.lease.slot, c.start, "a pass")
            self.content[c.lease.slot] = have[: c.start] + list(c.tokens)
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
        self._writes(slot, 0, "a release")
        self.released.append(slot)
        self.content.pop(slot, None)

    def snapshot(self, slot: int) -> tuple[bytes | bytearray, FakeRows]:
        tokens = list(self.content.get(slot, []))
        if not self.stage_heads:
            return _head(tokens), FakeRows(self, slot, tokens)
        head = bytearray(HEAD_BYTES)
        return head, FakeRows(self, slot, tokens, head)

    def rows(self, slot: int) -> FakeRows:
        self.opened += 1
        return FakeRows(self, slot, list(self.content.get(slot, [])))

    def restore(self, slot: int, head: bytes, segments) -> None:
        self._writes(slot, 0, "a restore")
        n = int.from_bytes(head[:8], "little")
        tokens, at = [], 0
        for start, end, data in segments:
            assert start == at and len(data) == BYTES_PER_TOKEN * (end - start)
            tokens += [
                int.from_bytes(data[i : i + 8], "little")
                for i in range(0, len(data), BYTES_PER_TOKEN)
            ]
            at = end
        if at != n or _head(tokens) != head:
            self.violations.append(f"restored slot {slot} from rows of other tokens")
        self.content[slot] = tokens
        self.restored.append((slot, n))

    def resume(self, slot: int, head: bytes) -> None:
        n = int.from_bytes(head[:8], "little")
        self._writes(slot, n, "a resume")
        have = self.content.get(slot, [])
        if len(have) < n or _head(have[:n]) != head:
            self.violations.append(f"resumed slot {slot} that does not hold the state")
        self.content[slot] = have[:n]
        self.resumed.append((slot, n))

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

    def graph_stats(self) -> dict[str, int]:
        return {}


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
