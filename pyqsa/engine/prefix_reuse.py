"""How the engine uses the prefix cache: a request gets its slot from the longest cached prefix of
its prompt, and slots are snapshotted into the cache where prompts and replies end and every
`stride` tokens inside a prompt (the scheduler ends prompt chunks there). Runs on the engine
thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .prefix_cache import PrefixCache, PrefixEntry
from .request import Request
from .runner import Runner, RunnerError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefixStats:
    hit_tokens: int  # prompt tokens whose state came from the cache, since start
    miss_tokens: int  # prompt tokens computed (not found in the cache), since start
    bytes: int  # held by the cache now
    entries: int
    evicted: int  # entries evicted for room, since start


class PrefixReuse:
    def __init__(self, runner: Runner, budget: int, stride: int) -> None:
        self.runner = runner
        self.cache = PrefixCache(budget)
        self.stride = stride
        self._hit_tokens = 0
        self._miss_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.cache.budget > 0

    def start(self, req: Request) -> PrefixEntry | None:
        """Give the newly leased slot of `req` the state of the longest cached prefix of its
        prompt, and start the request after it; the entry is held until `end`."""
        assert req.lease is not None
        entry = self.cache.match(req.prompt) if self.enabled else None
        if entry is not None:
            try:
                self.runner.restore(req.lease.slot, entry.state)
            except RunnerError:  # a state this context cannot take: computed as if not cached
                log.exception("restoring a cached prefix of %s failed", req.request_id)
                self.cache.release(entry)
                entry = None
        n = entry.n_tokens if entry is not None else 0
        req.num_computed_tokens = req.cached_tokens = n
        self._hit_tokens += n
        self._miss_tokens += len(req.prompt) - n
        return entry

    def end(self, entry: PrefixEntry | None) -> None:
        """The request that started from `entry` ended."""
        if entry is not None:
            self.cache.release(entry)

    def due(self, req: Request, chunk_start: int) -> bool:
        """Whether the slot of `req`, having just computed a chunk from `chunk_start`, should be
        snapshotted: its prompt ended there, or the chunk ended on a stride."""
        n = req.num_computed_tokens
        return (
            self.enabled
            and chunk_start < len(req.prompt)
            and (n == len(req.prompt) or n % self.stride == 0)
        )

    def snapshot(self, req: Request) -> None:
        """Keep the state of the tokens `req`'s slot holds now, unless the cache has it."""
        assert req.lease is not None
        tokens = req.tokens[: req.num_computed_tokens]
        if not self.enabled or not tokens or self.cache.contains(tokens):
            return
        try:
            state = self.runner.snapshot(req.lease.slot)
        except RunnerError:
            log.exception("snapshotting the slot of %s failed", req.request_id)
            return
        self.cache.insert(tokens, state)

    def clear(self) -> None:
        self.cache.clear()

    def stats(self) -> PrefixStats:
        c = self.cache
        return PrefixStats(self._hit_tokens, self._miss_tokens, c.bytes, len(c), c.evicted)
