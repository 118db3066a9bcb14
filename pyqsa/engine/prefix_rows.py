"""The rows of the prefix cache's states, copied off the engine thread.

A snapshot is a head (the slot's recurrent and conv states, cell metadata and, with paging, the
tail block's ring rows: `Runner.snapshot`, taken on the engine thread) and rows: per position, the
QSA layers' K/V, the indexer's keys and block keys (pyqsa_seq_state_save in native/include/pyqsa.h).
The rows of positions below n are not written again while the slot only grows, so they are
copied by one worker thread (`RowCopier`) while the engine goes on; the copy of a slot's rows must
end before the slot is emptied, shortened or loaded into (`RowCopier.wait`). The head's
recurrent state, most of its bytes, is staged on the engine thread (one copy at the bus's speed
into pinned memory) and copied into the head by the same worker (`HeadFill`), before its rows.

Rows come in segments of positions [start, end). The snapshots of one slot's sequence share them:
a snapshot at n copies only the positions since the slot's last segment, so a prompt's stride
snapshots hold its K/V once, not once per stride. A prompt's rows are also copied while it is
computed, every few thousand positions (a segment of its own, `Runner.rows`: no head), so the
snapshot where it ends, taken most often while other slots decode, has few left to copy.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)


class RowSource(Protocol):
    """Where a snapshot's rows are (native.SeqRows): `get` and `fill_head` may run on any
    thread. With `head_staged`, the head `Runner.snapshot` gave with it is whole only after
    `fill_head` (its recurrent state, ~80 MB a slot at the full shape, waits in a stage: the copy
    into the head's memory is the copier thread's, not the engine thread's)."""

    @property
    def head_staged(self) -> bool: ...

    def size(self, start: int, end: int) -> int: ...

    def get(self, start: int, end: int): ...  # a buffer of size(start, end) bytes

    def fill_head(self) -> None: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class HeadFill:
    """A staged head's copy: `done` once the copier made it (or failed to: `failed`)."""

    failed: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self) -> bool:
        """Until it is done; whether the head is whole."""
        self.done.wait()
        return not self.failed


@dataclass(eq=False)
class RowSegment:
    """The rows of positions [start, end) of one slot's sequence; `data` once copied."""

    start: int
    end: int
    nbytes: int
    slot: int  # whose rows the copy reads until it is done
    data: object | None = None
    failed: bool = False
    dropped: bool = False  # no entry holds it: its copy is skipped, its data let go
    refs: int = 0  # cache entries holding it (PrefixCache)
    done: threading.Event = field(default_factory=threading.Event)

    def drop(self) -> None:
        self.dropped = True
        self.data = None


def usable(segments: Sequence[RowSegment]) -> bool:
    """Whether these segments still hold (or are copying) their rows."""
    return not any(s.dropped or s.failed for s in segments)


class RowCopier:
    """One worker thread copying snapshots' staged heads and rows, in the order asked."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[RowSegment | None, RowSource, HeadFill | None] | None
        ] = queue.SimpleQueue()
        self._pending: dict[int, list[RowSegment]] = {}  # by slot; touched by the engine thread
        self.seconds = 0.0  # spent copying, since start
        self.copied = 0  # bytes copied, since start
        self._thread = threading.Thread(target=self._work, name="pyqsa-rows", daemon=True)
        self._thread.start()

    def copy(
        self, segment: RowSegment | None, source: RowSource, fill: HeadFill | None = None
    ) -> None:
        """On the worker thread: with a `fill`, the staged head of `source`; then `segment`, if
        any, from it; then close it."""
        if segment is not None:
            self._pending.setdefault(segment.slot, []).append(segment)
        self._jobs.put((segment, source, fill))

    def pending(self) -> int:
        return sum(not s.done.is_set() for segs in self._pending.values() for s in segs)

    def wait(self, slot: int, keep: int = 0) -> None:
        """Until every copy reading `slot`'s rows of positions from `keep` on is done: before
        the slot is written again from there (emptied: 0)."""
        left = []
        for segment in self._pending.pop(slot, []):
            if segment.end > keep:
                segment.done.wait()
            elif not segment.done.is_set():
                left.append(segment)
        if left:
            self._pending[slot] = left

    def wait_for(self, segments: Sequence[RowSegment]) -> None:
        for segment in segments:
            segment.done.wait()

    def close(self) -> None:
        """Finish the copies asked for, then stop the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            segment, source, fill = job
            if fill is not None:
                try:
                    started = time.perf_counter()
                    source.fill_head()
                    self.seconds += time.perf_counter() - started
                except Exception:
                    log.exception("copying a staged head failed")
                    fill.failed = True
                finally:
                    fill.done.set()
            if segment is None:
                source.close()
                continue
            try:
                if not segment.dropped:
                    started = time.perf_counter()
                    data = source.get(segment.start, segment.end)
                    self.seconds += time.perf_counter() - started
                    self.copied += segment.nbytes
                    if not segment.dropped:  # dropped meanwhile: let the copy go
                        segment.data = data
            except Exception:
                log.exception("copying rows %d..%d failed", segment.start, segment.end)
                segment.failed = True
            finally:
                source.close()
                segment.done.set()
