"""Incremental detokenization: UTF-8-safe text deltas with stop strings across tokens.

A token can end in the middle of a UTF-8 character, and a stop string can span several
tokens. Bytes of an incomplete character wait for the next token; text that could still be
the start of a stop string is held back until it no longer can be, so a stop string is never
streamed, not even in part.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class Detokenizer:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: tuple[str, ...] = ()) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._max_hold = max((len(s) for s in stop), default=1) - 1
        self._held = ""

    def add(self, token: int) -> tuple[str, bool]:
        """Feed one token; return (text safe to emit, whether a stop string was hit).

        After a hit, the returned text ends just before the stop string and the rest is
        dropped.
        """
        self._held += self._utf8.decode(self._token_bytes(token))
        if not self._stop:
            text, self._held = self._held, ""
            return text, False
        hits = [i for i in (self._held.find(s) for s in self._stop) if i >= 0]
        if hits:
            text, self._held = self._held[: min(hits)], ""
            return text, True
        keep = self._partial_stop_len()
        text = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return text, False

    def flush(self) -> str:
        """Everything held back, at the end of a request that did not stop on a string."""
        text, self._held = self._held + self._utf8.decode(b"", final=True), ""
        return text

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the held text that begins some stop string."""
        for k in range(min(len(self._held), self._max_hold), 0, -1):
            tail = self._held[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0
