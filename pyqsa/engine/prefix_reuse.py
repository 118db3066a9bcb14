"""How the engine uses the prefix cache: a request gets its slot from the longest cached prefix of
its prompt, and slots are snapshotted into the cache where prompts end and every `stride` tokens
inside a prompt (the scheduler ends prompt chunks there). Runs on the engine thread only.

A reply is not snapshotted where it ends: decode steps compute one token a pass, which rounds
differently from a prompt chunk (Scheduler._no_lone_last_tokens), so the state would not be the
one a server without the cache computes for the next turn's prompt. Instead, once a request
ends, a request of the engine's own (`reply_request`) computes its prompt and reply as a
prompt, from the prompt's cached state, in chunks; its snapshot is what the next turn finds. It
costs the reply's tokens once more as prefill (a prompt's worth less per turn than without the
cache) and a slot while it runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .prefix_cache import PrefixCache, PrefixEntry
from .request import Request, SamplingParams
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
        own = req.reply_of is not None  # not counted: the engine's own work
        if entry is not None:
            try:
                self.runner.restore(req.lease.slot, entry.state)
            except RunnerError:  # a state this context cannot take: computed as if not cached
                log.exception("restoring a cached prefix of %s failed", req.request_id)
                self.cache.release(entry)
                entry = None
        n = entry.n_tokens if entry is not None else 0
        req.num_computed_tokens = req.cached_tokens = n
        if not own:
            self._hit_tokens += n
            self._miss_tokens += len(req.prompt) - n
        return entry

    def reply_request(self, req: Request, arrival: int) -> Request | None:
        """For a request that ended with a reply of two tokens or more, the engine's request that
        computes its prompt and reply (its last token too) as a prompt, to be snapshotted there;
        None when the cache is off, has that state, or lacks its prompt's (it would compute
        more than the reply again), or the slot cannot hold one token more."""
        tokens = req.tokens
        if (
            not self.enabled
            or req.num_output_tokens < 2
            or len(tokens) >= req.lease.capacity
            or self.cache.longest(tokens) < len(req.prompt)
            or self.cache.contains(tokens)
        ):
            return None
        params = SamplingParams(temperature=0, max_tokens=1)
        return Request(
            f"{req.request_id}/reply",
            list(tokens),
            params,
            lambda ev: None,
            max_len=len(tokens) + 1,
            arrival=arrival,
            reply_of=req.request_id,
        )

    def end(self, entry: PrefixEntry | None) -> None:
        """The request that started from `entry` ended."""
        if entry is not None:
            self.cache.release(entry)

    def due(self, req: Request, chunk_start: int) -> bool:
        """Whether the slot of `req`, having just computed a chunk from `chunk_start`, should be
        snapshotted: its prompt ended there, or the chunk ended on a stride or the request's own
        snapshot point."""
        n = req.num_computed_tokens
        return (
            self.enabled
            and chunk_start < len(req.prompt)
            and (n == len(req.prompt) or n % self.stride == 0 or n == req.snapshot_at)
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
