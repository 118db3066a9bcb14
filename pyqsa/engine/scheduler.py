"""Continuous batching: which tokens of which requests go into the next step.

Each step has a token budget: `max_batch_tokens`, or `max_prefill_tokens` for a step with no
decode token whose prompts all need more than `max_batch_tokens` (long prompts only: a short
prompt's first token never waits for a large step of its own) or for a step that finishes every
prompt in flight where a regular one would not (short prompts that came together, such as
agents' follow-ups: their first tokens come from one pass; beside decode tokens too when each of
them is within a regular step, so the running requests wait one larger pass, not several regular
ones that each stage the follow-ups' histories again). Requests
whose cache is one token behind (decode) go first, one token each, whatever their age, so a
running request never stalls (the config keeps the budget at least the slot count). The rest of
the budget goes to prompt chunks, by the prefill policy:

- `fair` (default), max-min fair shares: every prompt in flight gets a chunk every step; a prompt
  that needs less than an equal share of what is left gets all it needs (it finishes its
  prefill this step), the others get the same share each. So a short prompt never waits behind
  long ones (once in a slot, L tokens take at most ceil(L / (budget // slots)) steps), long
  prompts keep progressing together and reach decode together, and nothing starves: with the
  budget >= slots, every prompt gets >= 1 token a step. It has no knob to tune, unlike
  shortest-remaining-first with aging, which would also serialise equally long prompts (the
  first finishes decoding before the last one starts).
- `fcfs`: the oldest prompt takes all the rest, then the next oldest; kept for comparison.

With host-backed KV paging (`long_turns`, set by the engine when it pages), `fair` counts the
prompts longer than the step budget as one prompt, whose share goes to one of them at a time, in
turn, instead of an equal share each: every chunk of a prompt brings its stream's history from host
memory, once per QSA layer (native/PAGING.md: a bulk copy into a prefetch area that holds one
stream's context, overlapping the layers before it; 512 MiB a layer at 256K, ~10 ms at PCIe speed),
so many small chunks pay the history many times over, and chunks of several long prompts in one
ubatch would not fit the area (they fall back to staging windows, 16 ms a QSA layer for a 512-token
chunk at 256K against ~1 ms of unpaged attention). Shorter prompts share the step with the long
ones' turn as with any other prompt; the long ones still reach decode together, and each gets a
chunk every so many steps (as many as there are long prompts). `bench/prefill_sim.py --paged`
models the cost (8 x 256K prompts, random selections: all first tokens at 2387 s with equal shares,
at 992-997 s taking turns; fcfs 125-1001 s; a 64-token request behind 7 x 64K still gets its first
at 0.2 s. A model, not a measurement).

`bench/prefill_sim.py` measures both on the serving workloads with a model of llama.cpp's
batch splitting (below) and the H200's step costs (8 slots, 512-token steps). A 64-token
request sent 2 s after 7 x 32K prompts: first token after 0.19 s (fair) against 66.8 s (fcfs).
8 x 32K prompts: all first tokens at 73 s, then 191 steps with all 8 decoding (fair), against
first tokens every ~10 s from 9 s to 79 s and never 8 decoding at once (fcfs). 200 mixed
requests (16-16K-token prompts, 1/s): median first token 0.4 s (<= 256 tokens) and 3.2 s
(longer) against 3.5 s and 5.6 s, at the price of the long tail (p99 15.5 s against 12.1 s).
A short request that finds every slot taken waits under both (75 s and 77 s behind 8 x 32K):
the policy shares steps, not slots.

NOTE: chunk shapes decide how many passes a step costs. With one KV stream per sequence
(`kv_unified` off) llama_decode splits a batch with `split_equal(sequential)`: one ubatch takes
the same number of tokens from every sequence of a run of consecutive seq ids, met in batch
order, so a step costs one ubatch per distinct chunk length and per break in the seq ids, each
a full pass over the weights (tests/unit/test_prefill_split.py checks this on llama.cpp).
Hence: chunks are ordered by slot; the prompts that do not finish get equal chunks, and the
remainder of the division stays unused rather than buying a pass of a few tokens; for the same
reason a prompt whose chunk would leave it a short tail (at most 1/8 of the budget) takes the
tail now, over the step budget, within the batch (`_with_short_tails`). Decode
tokens (1 each) cost a pass of their own before the prompt chunks, as they always did; a
prompt finishing on a shorter chunk costs one or two more in that step; slots freed between
busy ones split a step by their gap, which no chunk shape avoids.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .request import Request, RequestState
from .slots import SlotLease, SlotTable

# (tokens each prompt still has to prefill, oldest first; token budget) -> chunk length of each
PrefillPolicy = Callable[[Sequence[int], int], list[int]]


def fair_shares(remaining: Sequence[int], budget: int) -> list[int]:
    """Max-min fair split: prompts needing at most an equal share of what is left get all they
    need; the rest get `left // n` each (equal chunks; the remainder of the division unused)."""
    order = sorted(range(len(remaining)), key=lambda i: remaining[i])
    shares = [0] * len(remaining)
    left = budget
    for k, i in enumerate(order):
        n_left = len(order) - k
        if remaining[i] * n_left > left:  # this and every longer prompt get an equal share
            for j in order[k:]:
                shares[j] = left // n_left
            break
        shares[i] = remaining[i]
        left -= remaining[i]
    return shares


def fcfs_shares(remaining: Sequence[int], budget: int) -> list[int]:
    """The oldest prompt takes the whole budget, the next oldest what is left, and so on."""
    shares = []
    for r in remaining:
        shares.append(min(r, budget))
        budget -= shares[-1]
    return shares


PREFILL_POLICIES: dict[str, PrefillPolicy] = {"fair": fair_shares, "fcfs": fcfs_shares}

# a prompt chunk that would leave at most this fraction (1 / TAIL_SHARE) of the step budget
# takes the rest too (Scheduler._with_short_tails)
TAIL_SHARE = 8


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
    def __init__(
        self,
        slots: SlotTable,
        max_batch_tokens: int,
        policy: str = "fair",
        max_prefill_tokens: int | None = None,
        long_turns: bool = False,
        snapshot_stride: int = 0,
        on_admit: Callable[[Request], None] | None = None,
        place: Callable[[Request], int | None] | None = None,
    ) -> None:
        # NOTE: every running slot must be able to decode one token per step (EngineConfig
        # checks it for users): then decode never waits and every prompt gets >= 1 token.
        assert max_batch_tokens >= slots.n_slots
        self.slots = slots
        self.max_batch_tokens = max_batch_tokens
        # the budget of a step with no decode token in it and only long prompts (each needing
        # more than a regular step): larger steps prefill faster (bigger matrix products) and
        # delay no running request; a request that arrives meanwhile waits for that one step,
        # and while a prompt of at most a regular step is in flight steps stay regular, so its
        # first token does not wait for a large one of its own
        self.max_prefill_tokens = max(max_prefill_tokens or 0, max_batch_tokens)
        self.policy = PREFILL_POLICIES[policy]
        # with paging, fair's long prompts take turns (see the module docstring); the next one's
        # index among them
        self.long_turns = long_turns and policy == "fair"
        self._turn = 0
        # > 0: prompt chunks end on every multiple of it, where the prefix cache takes snapshots
        self.snapshot_stride = snapshot_stride
        # called with each request as it gets its slot, before its first chunk: it may start the
        # request further on (num_computed_tokens: a prefix whose state the slot was given)
        self.on_admit = on_admit
        # called with each request about to get a slot: the free slot it should have (one that
        # holds a prefix of its prompt), or None for any
        self.place = place
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest first

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def finish(self, req: Request, keep: bool = False) -> None:
        """Take `req` out of the queue or its slot, releasing the lease (the slot holding its
        sequence on with `keep`). Idempotent."""
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
        elif req.state is RequestState.RUNNING:
            self.running.remove(req)
            assert req.lease is not None
            self.slots.release(req.lease, keep)
        req.state = RequestState.FINISHED

    def schedule(self) -> list[Chunk]:
        """Admit waiting requests into free slots, then plan one step within the budget:
        decode tokens, then prompt chunks by the policy; in slot order."""
        while self.waiting:
            if self.slots.busy == self.slots.n_slots:
                break
            prefer = self.place(self.waiting[0]) if self.place is not None else None
            lease = self.slots.acquire(prefer)
            if lease is None:
                break
            req = self.waiting.popleft()
            req.lease, req.state = lease, RequestState.RUNNING
            self.running.append(req)
            if self.on_admit is not None:
                self.on_admit(req)

        decode = [r for r in self.running if r.num_pending == 1]
        prompts = [r for r in self.running if r.num_pending > 1]
        remaining = [r.num_pending for r in prompts]
        # the larger budget with no decode token for long prompts only, or where it finishes
        # every prompt in flight at once and a regular step would not: several follow-ups that
        # arrived together get all their first tokens from that one pass instead of the last of
        # the regular steps their fair shares take. Beside decode tokens only prompts each within
        # a regular step: the decoders then wait one pass of those, never a long prompt's chunk.
        # NOTE: agents' follow-ups of ~500 tokens at 200K, two or three in flight beside others'
        # decode tokens, took 2-3 regular steps to their first tokens (0.57-0.87 s, against
        # 0.15-0.26 s for one alone: bench/results/2026-12-04-fff4b6a-prefix-trace.txt), each
        # step a pass per stream that brings its history to the device once per QSA layer
        n_all = sum(remaining) + len(decode)
        finishes = self.max_batch_tokens < n_all <= self.max_prefill_tokens
        short = max(remaining, default=0) <= self.max_batch_tokens
        long_only = not decode and min(remaining, default=0) > self.max_batch_tokens
        large = long_only or (finishes and (not decode or short))
        budget = (self.max_prefill_tokens if large else self.max_batch_tokens) - len(decode)
        if self.long_turns:
            shares = self._long_ones_take_turns(remaining, budget)
        else:
            shares = self.policy(remaining, budget)
        shares = self._with_short_tails(remaining, shares, budget, len(decode))
        shares = self._no_lone_last_tokens(
            prompts, [self._to_stride(r, n) for r, n in zip(prompts, shares, strict=True)], budget
        )
        chunks = [self._chunk(r, 1) for r in decode]
        chunks += [self._chunk(r, n) for r, n in zip(prompts, shares, strict=True) if n > 0]
        chunks.sort(key=lambda c: c.lease.slot)
        return chunks

    def _long_ones_take_turns(self, remaining: list[int], budget: int) -> list[int]:
        """Fair shares in which the prompts longer than the budget count as one prompt, whose
        share goes to one of them, the next in turn (oldest first)."""
        long = [i for i, r in enumerate(remaining) if r > budget]
        if len(long) < 2:
            return self.policy(remaining, budget)
        rest = [i for i, r in enumerate(remaining) if r <= budget]
        as_one = sum(remaining[i] for i in long)
        group = self.policy([remaining[i] for i in rest] + [as_one], budget)
        shares = [0] * len(remaining)
        for i, n in zip(rest, group[:-1], strict=True):
            shares[i] = n
        shares[long[self._turn % len(long)]] = group[-1]  # < its remaining: it goes on later
        self._turn += 1
        return shares

    def _with_short_tails(
        self, remaining: list[int], shares: list[int], budget: int, n_decode: int
    ) -> list[int]:
        """Shares in which a prompt whose chunk would leave it at most budget // TAIL_SHARE
        tokens takes them now, over the budget, as long as the step fits the batch.

        NOTE: the last few tokens of a prompt would buy a pass of their own next step, whose cost
        hardly depends on its tokens: the weights read once more and, with paging, the stream's
        history brought to the device once per QSA layer (~0.13 s at 200K on the H200). An agent's
        follow-up of 500 new tokens after a 32-token reply, beside others' decode tokens in
        512-token steps, took two steps (0.74-0.99 s to its first token) where one would do
        (0.22-0.33 s for those that had their step alone: bench/results/*-prefix-trace.txt)."""
        out = list(shares)
        room = self.max_prefill_tokens - n_decode - sum(out)
        for i, (left, n) in enumerate(zip(remaining, out, strict=True)):
            tail = left - n
            if n > 0 and 0 < tail <= budget // TAIL_SHARE and tail <= room:
                out[i], room = left, room - tail
        return out

    def _to_stride(self, req: Request, n: int) -> int:
        """A prompt chunk of up to n tokens cut at the next multiple of the snapshot stride and
        at the request's own snapshot point."""
        if not self.snapshot_stride:
            return n
        start = req.num_computed_tokens
        n = min(n, self.snapshot_stride - start % self.snapshot_stride)
        if req.snapshot_at is not None and start < req.snapshot_at:
            n = min(n, req.snapshot_at - start)
        return n

    @staticmethod
    def _no_lone_last_tokens(prompts: list[Request], shares: list[int], budget: int) -> list[int]:
        """Shares that leave no prompt a last token on its own: such a chunk takes one more token
        where the step has one to spare, else one fewer (if it keeps one).

        NOTE: a forward pass of one token takes other kernels than a chunk's (ggml's CPU matrix
        products: the vector path below two columns, llamafile's tiles from two on; on CUDA the
        matrix-vector kernels), which round differently. A last prompt token left alone would
        make a prompt's state depend on where its chunks happened to end; without it, a prompt's
        state is the same however it was split (tests/unit/test_prefix_exact.py), so a prefix
        restored from the prefix cache continues exactly as the prompt computed from its start."""
        out = list(shares)
        spare = budget - sum(out)
        for i, (req, n) in enumerate(zip(prompts, out, strict=True)):
            if n < 1 or req.num_pending - n != 1:
                continue
            if spare > 0:
                out[i], spare = n + 1, spare - 1
            elif n >= 2:
                out[i], spare = n - 1, spare + 1
        return out

    @staticmethod
    def _chunk(req: Request, n: int) -> Chunk:
        assert req.lease is not None
        start = req.num_computed_tokens
        return Chunk(req, req.lease, start, tuple(req.tokens[start : start + n]))
