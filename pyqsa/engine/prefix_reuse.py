"""How the engine uses the prefix cache: a request starts from the longest prefix of its prompt
that a free slot still holds or the cache has, and slots are snapshotted where prompts end and
every `stride` tokens inside a prompt (the scheduler ends prompt chunks there). Runs on the
engine thread only.

Where a request starts, longest prefix first, the cheapest way at equal lengths:
- in place (`continue`): a free slot holds exactly a prefix of the prompt, all of it computed as
  a prompt, and nothing since: the request takes that slot and computes only the rest;
- `resume`: a free slot's prompt-computed positions start with a cached entry's (the slot went
  on past it, e.g. decoding a reply): the entry's head (recurrent state, tail rows) is loaded
  there and the later positions dropped; its rows stay where they are (Runner.resume);
- `restore`: the entry's head and rows are loaded into the slot (Runner.restore).
A request's slot holds its sequence on after it ends (SlotTable `keep`) until another request
needs the slot; then the least recently used one is emptied.

A reply is not snapshotted where it ends: decode steps compute one token a pass, which rounds
differently from a prompt chunk (Scheduler._no_lone_last_tokens), so the state would not be the
one a server without the cache computes for the next turn's prompt. Instead, once a request
ends, a request of the engine's own (`reply_request`) computes its prompt and reply as a
prompt, from the prompt's cached state (in its own slot: a resume), in chunks; its snapshot is
what the next turn finds, and its slot holds exactly that for the next turn to continue in place.
The engine makes one only when no other request runs or waits (Engine._finish): among others its
head load, pass and snapshot would delay their steps, and the next turn resumes at its prompt's
end instead, computing the reply with its new tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .prefix_cache import PrefixCache, PrefixEntry, Tokens
from .prefix_rows import HeadFill, RowCopier, RowSegment, usable
from .request import Request, SamplingParams
from .runner import Runner, RunnerError

log = logging.getLogger(__name__)

STARTS = ("continue", "resume", "restore")
_RANK = {kind: i for i, kind in enumerate((*STARTS, "none"))}  # the cheaper first


@dataclass(frozen=True)
class PrefixStats:
    hit_tokens: int  # prompt tokens whose state came from the cache or a slot, since start
    miss_tokens: int  # prompt tokens computed, since start
    bytes: int  # held by the cache now
    entries: int
    evicted: int  # entries evicted for room, since start
    starts: dict[str, int] = field(default_factory=dict)  # requests started, by STARTS
    pending_copies: int = 0  # row segments being copied now
    copy_seconds: float = 0.0  # the copier thread's time copying rows, since start
    # the engine thread's time in snapshots, resumes and restores (waits for copies included)
    engine_seconds: float = 0.0
    snapshots: int = 0  # heads taken, since start
    staged: int = 0  # of them, those whose recurrent state went through a stage


@dataclass(eq=False)
class _Holding:
    """What a free slot holds: `tokens` (its positions), the first `exact` of them computed as a
    prompt (the state a server without the cache computes for them)."""

    tokens: np.ndarray
    exact: int


@dataclass(frozen=True)
class _Plan:
    kind: str  # one of STARTS, or "none"
    n: int  # prompt tokens it takes
    slot: int | None = None  # the free slot it starts in (continue, resume)


def _leads(segments: tuple[RowSegment, ...], lineage: list[RowSegment]) -> bool:
    return len(segments) <= len(lineage) and all(
        a is b for a, b in zip(segments, lineage, strict=False)
    )


class PrefixReuse:
    def __init__(self, runner: Runner, budget: int, stride: int, ahead: int) -> None:
        self.runner = runner
        self.cache = PrefixCache(budget)
        self.stride = stride
        self.ahead = ahead
        self.copier = RowCopier() if budget > 0 else None
        self._held: dict[int, _Holding] = {}  # free slots holding their sequence
        self._lineage: dict[int, list[RowSegment]] = {}  # per slot: its rows in the cache, in order
        self._plans: dict[str, _Plan] = {}
        self._prompts: dict[str, Tokens] = {}  # of the requests placed and not ended
        self._hit_tokens = 0
        self._miss_tokens = 0
        self._starts = dict.fromkeys(STARTS, 0)
        self._engine_seconds = 0.0
        self._snapshots = 0
        self._staged = 0

    @property
    def enabled(self) -> bool:
        return self.cache.budget > 0

    def place(self, req: Request, free_held: list[int]) -> int | None:
        """The free slot (of `free_held`, least recently used first) that `req` should have,
        None for any; remembers how it starts there for `start`."""
        if not self.enabled:
            return None
        prompt = self._prompt(req)
        best = self._from_cache(prompt)
        for slot in free_held:
            plan = self._in_place(prompt, slot)
            if plan is not None and (plan.n, -_RANK[plan.kind]) > (best.n, -_RANK[best.kind]):
                best = plan
        self._plans[req.request_id] = best
        return best.slot

    def _prompt(self, req: Request) -> Tokens:
        if (t := self._prompts.get(req.request_id)) is None:
            t = self._prompts[req.request_id] = Tokens(req.prompt)
        return t

    def _from_cache(self, prompt: Tokens) -> _Plan:
        n = self.cache.longest(prompt) if self.enabled else 0
        return _Plan("restore" if n else "none", n)

    def _in_place(self, prompt: Tokens, slot: int) -> _Plan | None:
        h = self._held[slot]
        n, p = len(h.tokens), prompt.array
        if n == h.exact and len(p) >= n + 2 and np.array_equal(p[:n], h.tokens):
            return _Plan("continue", n, slot)
        m = min(len(p), h.exact)
        differ = np.flatnonzero(p[:m] != h.tokens[:m])
        common = int(differ[0]) if len(differ) else m
        # NOTE: only an entry whose rows are this slot's own (its segments lead the slot's): the
        # same tokens computed in another slot, beside other requests, may differ in their last
        # bits, and its head would not be the state of these rows
        lineage = self._lineage.get(slot, [])
        n = self.cache.longest(prompt, common, lambda e: _leads(e.segments, lineage))
        return _Plan("resume", n, slot) if n else None

    def start(self, req: Request) -> PrefixEntry | None:
        """Start `req`, which just got its slot, after the prefix `place` found for it (the entry
        it started from is held until `end`)."""
        assert req.lease is not None
        if not self.enabled:
            self._miss_tokens += len(req.prompt) * (req.reply_of is None)
            return None
        slot = req.lease.slot
        prompt = self._prompt(req)
        plan = self._plans.pop(req.request_id, None)
        if plan is None or plan.slot not in (None, slot):
            plan = self._from_cache(prompt)
        if self._held.pop(slot, None) is not None and plan.slot is None:
            self._empty(slot)  # kept for a reuse in place, taken for another start
        entry = self.cache.match(prompt, plan.n) if plan.n else None
        if entry is not None and entry.n_tokens != plan.n:  # continue: no entry of its length
            self.cache.release(entry)
            entry = None
        started = time.perf_counter()
        try:
            if plan.kind in ("resume", "restore") and entry.fill and not entry.fill.wait():
                raise RunnerError("its head could not be copied")
            if plan.kind == "resume":
                self.copier.wait(slot, plan.n)  # the positions from n on are dropped
                self.runner.resume(slot, entry.head)
            elif plan.kind == "restore":
                if not usable(entry.segments):
                    raise RunnerError("its rows could not be copied")
                self.copier.wait_for(entry.segments)
                segments = [(s.start, s.end, s.data) for s in entry.segments]
                self.runner.restore(slot, entry.head, segments)
        except RunnerError:  # a state this context cannot take: computed as if not cached
            log.exception("starting %s from a cached prefix failed", req.request_id)
            if entry is not None:
                self.cache.release(entry)
            self.runner.release(slot)
            entry, plan = None, _Plan("none", 0)
        self._engine_seconds += time.perf_counter() - started
        if plan.kind in ("resume", "restore"):
            self._lineage[slot] = list(entry.segments)
        elif plan.kind == "none":
            self._lineage[slot] = []
        req.num_computed_tokens = req.cached_tokens = plan.n
        if req.reply_of is None:  # not counted: the engine's own work
            self._hit_tokens += plan.n
            self._miss_tokens += len(req.prompt) - plan.n
            if plan.n:
                self._starts[plan.kind] += 1
        return entry

    def adopt(self, req: Request, prompt: Tokens) -> None:
        """`prompt`, made off the engine thread, is the Tokens of `req.prompt` (see `prompt`)."""
        self._prompts[req.request_id] = prompt

    @staticmethod
    def prompt(tokens: list[int] | np.ndarray) -> Tokens:
        """The Tokens of a prompt with its hashes, for `adopt`: made by the thread that submits
        it (5 ms for a 200K-token list here), not the engine thread, which every request's steps
        wait for."""
        t = Tokens(tokens)
        t.hashes()
        return t

    def reply_request(self, req: Request, arrival: int) -> Request | None:
        """For a request that ended with a reply of two tokens or more (called before `end`),
        the engine's request that computes its prompt and reply (its last token too) as a
        prompt, to be snapshotted there; None when the cache is off, has that state, or lacks
        its prompt's (it would compute more than the reply again), or the slot cannot hold one
        token more."""
        if not self.enabled or req.num_output_tokens < 2 or len(req.tokens) >= req.lease.capacity:
            return None
        # NOTE: its prompt's tokens and hashes extended by the reply: a conversion and a hash of
        # the whole would cost the engine thread ~10 ms a 200K-token conversation
        tokens = self._prompt(req).extended(req.tokens[len(req.prompt) :])
        if self.cache.longest(tokens) < len(req.prompt) or self.cache.contains(tokens):
            return None
        params = SamplingParams(temperature=0, max_tokens=1)
        again = Request(
            f"{req.request_id}/reply",
            list(req.tokens),
            params,
            lambda ev: None,
            max_len=len(tokens) + 1,
            arrival=arrival,
            reply_of=req.request_id,
        )
        self._prompts[again.request_id] = tokens
        return again

    def end(self, req: Request, entry: PrefixEntry | None, keep: bool) -> None:
        """`req`, which started from `entry`, ended; `keep`: its slot holds its sequence on."""
        if entry is not None:
            self.cache.release(entry)
        prompt = self._prompts.pop(req.request_id, None)
        if keep and req.lease is not None and prompt is not None:
            n, exact = req.num_computed_tokens, min(req.num_computed_tokens, len(prompt))
            tokens = np.concatenate(
                (prompt.array[:exact], np.asarray(req.tokens[exact:n], np.int64))
            )
            self._held[req.lease.slot] = _Holding(tokens, exact)

    def forget(self, slot: int) -> None:
        """The slot is about to be emptied: its copies end first."""
        if self.copier is not None:
            self.copier.wait(slot)
        self._held.pop(slot, None)
        self._lineage.pop(slot, None)

    def _empty(self, slot: int) -> None:
        self.forget(slot)
        self.runner.release(slot)

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
        """Keep the state of the tokens `req`'s slot holds now, unless the cache has it: the head
        now, the rows since the slot's last segment by the copier."""
        assert req.lease is not None
        slot, n = req.lease.slot, req.num_computed_tokens
        prompt = self._prompt(req)
        assert n <= len(prompt)  # snapshots are taken inside prompts
        if not self.enabled or not n:
            return
        if self.cache.contains(prompt, n):  # (this slot's later snapshots copy their own rows)
            return
        started = time.perf_counter()
        try:
            head, source = self.runner.snapshot(slot)
        except RunnerError:
            log.exception("snapshotting the slot of %s failed", req.request_id)
            return
        finally:
            self._engine_seconds += time.perf_counter() - started
        self._snapshots += 1
        segments = []
        for seg in self._lineage.get(slot, []):
            if seg.dropped or seg.failed or seg.end > n:
                break
            segments.append(seg)
        k = segments[-1].end if segments else 0
        new = RowSegment(k, n, source.size(k, n), slot) if k < n else None
        fill = HeadFill() if source.head_staged else None
        self._staged += fill is not None
        if not self.cache.insert(prompt, head, segments + ([new] if new else []), n, fill):
            source.close()
            return
        self._lineage[slot] = segments + ([new] if new else [])
        if new is None and fill is None:
            source.close()
        else:
            self.copier.copy(new, source, fill)

    def copy_ahead(self, req: Request) -> None:
        """`req`'s slot computed a chunk inside its prompt: once `ahead` positions or more came
        since its last segment, they become one, copied now, which its next snapshot holds (the
        one where the prompt ends copies only the rest; its decode steps, and the other slots',
        run beside fewer copies). Until then the cache does not count its bytes: at most
        `stride` positions a slot."""
        if not self.enabled:
            return
        slot, n = req.lease.slot, req.num_computed_tokens
        lineage = self._lineage.setdefault(slot, [])
        k = lineage[-1].end if lineage else 0
        if n - k < self.ahead or not usable(lineage):
            return
        try:
            source = self.runner.rows(slot)
        except RunnerError:
            log.exception("opening the rows of %s failed", req.request_id)
            return
        segment = RowSegment(k, n, source.size(k, n), slot)
        lineage.append(segment)
        self.copier.copy(segment, source)

    def clear(self) -> None:
        self.cache.clear()

    def close(self) -> None:
        if self.copier is not None:
            self.copier.close()

    def stats(self) -> PrefixStats:
        c = self.cache
        return PrefixStats(
            self._hit_tokens,
            self._miss_tokens,
            c.bytes,
            len(c),
            c.evicted,
            dict(self._starts),
            self.copier.pending() if self.copier else 0,
            self.copier.seconds if self.copier else 0.0,
            self._engine_seconds,
            self._snapshots,
            self._staged,
        )
