"""The engine: one thread owns the model and runs schedule -> run -> postprocess.

Other threads talk to it only through `submit` and `cancel`, which post commands to a queue;
results go back through each request's sink as typed `Delta` / `Finished` events, called on
the engine thread (a sink must not block: the server's sink hands events to its event loop).
A step's events are handed to the sinks together while the next forward pass gets under way (on a
GPU: once it is queued, so this host work overlaps the pass), or when the engine runs out of
work: see `_deliver`.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..native import SampleResult
from .config import EngineConfig
from .detokenizer import Detokenizer
from .prefix_cache import PrefixEntry, Tokens
from .prefix_reuse import PrefixReuse, PrefixStats
from .request import (
    Delta,
    EventSink,
    Finished,
    FinishReason,
    Request,
    RequestState,
    SamplingParams,
    TokenLogprob,
)
from .runner import (
    DEVICE_MAX_ADJUST,
    Runner,
    RunnerAborted,
    RunnerError,
)
from .sampler import Sampler
from .scheduler import Chunk, Scheduler
from .slots import SlotTable

log = logging.getLogger(__name__)


class Vocab(Protocol):
    def token_bytes(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


class AdmissionError(Exception):
    """A request the engine refuses up front; nothing was queued."""


class PromptTooLong(AdmissionError):
    pass


class QueueFull(AdmissionError):
    pass


class EngineStopped(AdmissionError):
    pass


@dataclass(frozen=True)
class EngineStats:
    n_slots: int
    busy_slots: int
    waiting: int  # queued for a slot
    in_flight: int  # submitted and not yet finished (queued, running, or in the inbox)
    prompt_tokens: int  # totals since start
    generated_tokens: int
    finished: dict[str, int]  # by finish reason
    tokens_per_second: float  # generated, over the last few seconds
    ledger: dict[str, int]  # the runner's bytes by category, as of the last step
    steps: int  # forward passes run, since start
    # their seconds since start: "forward" in the runner, "host" the rest of each step
    # (scheduling, sampling, detokenization, events); "launch" is the part of "forward" until
    # the pass got under way (Runner.run's on_launch): on a GPU the host's work that the device
    # waits for, the rest of "forward" the wait for the device
    step_seconds: dict[str, float]
    # the runner's paging counters (Runner.paging_stats), read after a forward pass at most
    # once per PAGING_READ_INTERVAL_S and once due when the engine idles, so up to that
    # interval behind; None when it does not page
    paging: dict[str, int] | None = None
    # model layer index -> (hits, misses) of each paged layer, read with `paging`
    paging_layers: dict[int, tuple[int, int]] | None = None
    prefix: PrefixStats | None = None  # the prefix cache's figures, as of the last step
    graphs: dict[str, int] = field(default_factory=dict)  # Runner.graph_stats, as of the last step


@dataclass(eq=False)
class _Live:
    req: Request
    sampler: Sampler
    detok: Detokenizer
    prefix: PrefixEntry | None = None  # the cached prefix the request started from, held


_TPS_WINDOW_S = 5.0
# NOTE: reading the paging counters waits for the device and copies its counter tensors, so
# they are read at most this often (seconds), not after every forward pass
PAGING_READ_INTERVAL_S = 1.0


class Engine:
    def __init__(self, config: EngineConfig, runner: Runner, vocab: Vocab) -> None:
        self.config = config
        self.runner = runner
        self.vocab = vocab
        self.slots = SlotTable(config.n_slots, config.ctx_per_slot, self._empty_slot)
        self.prefix = PrefixReuse(
            runner, config.prefix_cache_bytes, config.prefix_stride, config.prefix_rows_ahead
        )
        self.scheduler = Scheduler(
            self.slots,
            config.max_batch_tokens,
            config.prefill_policy,
            config.max_prefill_tokens,
            long_turns=config.hot_blocks > 0,  # each chunk stages its stream's history
            snapshot_stride=config.prefix_stride if self.prefix.enabled else 0,
            on_admit=self._start_from_prefix,
            place=self._place,
        )
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards the counters below
        self._in_flight = 0
        self._prompt_tokens = 0
        self._generated = 0
        self._finished = {r.value: 0 for r in FinishReason}
        self._recent: deque[tuple[float, int]] = deque()
        self._busy = 0
        self._waiting = 0
        self._ledger: dict[str, int] = {}
        self._paging: dict[str, int] | None = None
        self._paging_layers: dict[int, tuple[int, int]] | None = None
        self._graphs: dict[str, int] = {}
        self._paging_due = float("-inf")  # time.monotonic() from which they may be read again
        self._paging_stale = False  # forward passes ran since they were read (when it pages)
        self._prefix_stats: PrefixStats | None = None
        self._steps_run = 0
        self._step_seconds = {"forward": 0.0, "host": 0.0, "launch": 0.0}
        self._launched: float | None = None  # perf_counter() when the pass in flight got going
        self._stopped = False
        self._outbox: list[tuple[Request, Delta | Finished]] = []  # events not yet delivered
        self._broken_sinks: list[Request] = []  # requests whose sink raised, to be cancelled
        # prompts that ended in the last pass, snapshotted once their first tokens are out
        self._snapshots_due: list[Request] = []
        # ids of the requests in the forward pass in flight not cancelled yet; None between passes
        self._pass_uncancelled: set[str] | None = None
        self._thread = threading.Thread(target=self._loop, name="pyqsa-engine", daemon=True)
        # a step's rows are sampled side by side: the host sampler (pyqsa_sample, 2-3 ms for a
        # 150K vocabulary here) lets go of the GIL, and each request's draws depend only on its
        # own seed and counter
        self._samplers = ThreadPoolExecutor(
            min(config.n_slots, os.cpu_count() or 1), thread_name_prefix="pyqsa-sample"
        )

    # -- API for other threads -------------------------------------------------------------

    def start(self) -> Engine:
        self._publish(counters=True)  # initial figures, before the thread owns the runner
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cancel everything, stop the thread; idempotent."""
        with self._lock:
            self._stopped = True
            if self._pass_uncancelled is not None:
                self.runner.request_abort()  # everything in it is being cancelled
        self._inbox.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join()
        self._samplers.shutdown()
        self.prefix.close()

    def submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        sink: EventSink,
        request_id: str | None = None,
        snapshot_at: int | None = None,
        ids: np.ndarray | None = None,
    ) -> str:
        """Queue a request; its events go to `sink`. Raises an AdmissionError when refused.
        `snapshot_at`: a prompt length where the prefix cache also takes a snapshot (the chat
        server's: the conversation before the reply's generation prompt). `ids`: the prompt as
        an int64 array, where the caller has one, that the prefix cache takes instead of
        converting the prompt again (4 ms for 200K tokens here)."""
        cap = self.config.ctx_per_slot
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) >= cap:
            raise PromptTooLong(
                f"the prompt has {len(prompt)} tokens; a slot holds {cap} "
                f"(prompt plus at least one generated token)"
            )
        max_len = cap if params.max_tokens is None else min(cap, len(prompt) + params.max_tokens)
        grammar = self.vocab.grammar(params.grammar) if params.grammar else None  # GrammarError
        try:
            with self._lock:
                if self._stopped:
                    raise EngineStopped("the engine is shutting down")
                if self._in_flight >= self.config.n_slots + self.config.max_waiting:
                    raise QueueFull(
                        f"all {self.config.n_slots} slots are busy and "
                        f"{self.config.max_waiting} requests are waiting"
                    )
                self._in_flight += 1
                n = next(self._ids)
        except AdmissionError:
            if grammar is not None:
                grammar.close()
            raise
        rid = request_id or f"req-{n}"
        req = Request(
            rid,
            list(prompt),
            params,
            sink,
            max_len=max_len,
            arrival=n,
            grammar=grammar,
            snapshot_at=snapshot_at,
        )
        tokens = (
            self.prefix.prompt(req.prompt if ids is None else ids) if self.prefix.enabled else None
        )
        self._inbox.put(("submit", (req, tokens)))
        return rid

    def cancel(self, request_id: str) -> None:
        """Cancel a queued or running request; unknown or finished ids are ignored. A forward
        pass in flight is aborted once every request in it is cancelled."""
        # NOTE: only then. When llama_decode aborts, upstream removes the aborted ubatch's
        # positions from each of its sequences, which a recurrent (GDN) state cannot undo past
        # position 0 (llama_memory_recurrent::seq_rm refuses; the state stays half-updated):
        # any other sequence in the pass would be corrupted, and cannot be re-run.
        with self._lock:
            uncancelled = self._pass_uncancelled
            if uncancelled is not None and request_id in uncancelled:
                uncancelled.remove(request_id)
                if not uncancelled:
                    self.runner.request_abort()
        self._inbox.put(("cancel", request_id))

    def clear_prefix_cache(self) -> Future[None]:
        """Drop the prefix cache's entries that no running request holds; the future is done
        once they are gone (the held ones go when evicted after their requests end)."""
        done: Future[None] = Future()
        self._inbox.put(("clear_prefix", done))
        return done

    def stats(self) -> EngineStats:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - _TPS_WINDOW_S:
                self._recent.popleft()
            recent = sum(n for _, n in self._recent)
            return EngineStats(
                n_slots=self.config.n_slots,
                busy_slots=self._busy,
                waiting=self._waiting,
                in_flight=self._in_flight,
                prompt_tokens=self._prompt_tokens,
                generated_tokens=self._generated,
                finished=dict(self._finished),
                tokens_per_second=recent / _TPS_WINDOW_S,
                ledger=dict(self._ledger),
                steps=self._steps_run,
                step_seconds=dict(self._step_seconds),
                paging=dict(self._paging) if self._paging is not None else None,
                paging_layers=dict(self._paging_layers)
                if self._paging_layers is not None
                else None,
                prefix=self._prefix_stats,
                graphs=dict(self._graphs),
            )

    # -- engine thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        reason, error = FinishReason.CANCELLED, None
        try:
            self._steps()
        except Exception as e:
            # NOTE: a bug must not leave clients waiting forever on a dead thread: fail what
            # is in flight and refuse what comes next.
            log.exception("engine thread failed")
            reason, error = FinishReason.ERROR, f"engine failure: {e}"
        with self._lock:
            self._stopped = True
        while True:  # submissions that raced with the stop
            try:
                cmd, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if cmd == "submit":
                self._admit(*arg)
        for live in list(self._live.values()):
            self._finish(live.req, reason, error=error)
        self._deliver()
        self._publish(counters=True, force=True)

    def _steps(self) -> None:
        while True:
            self._cancel_broken_sinks()
            idle = not self.scheduler.running and not self.scheduler.waiting
            if idle:
                self._deliver()  # no forward pass comes to carry them
                self._publish(counters=self._paging_stale)
            # idle with the last passes' paging counters unread: wait for a command only until
            # they are due, then read them (below)
            due = self._paging_due - time.monotonic() if idle and self._paging_stale else None
            if not self._drain(block=idle, timeout=None if due is None else max(0.0, due)):
                return
            started = time.perf_counter()
            chunks = self.scheduler.schedule()
            if not chunks:
                self._publish(counters=self._paging_stale)
                continue
            with self._lock:
                self._pass_uncancelled = {c.request.request_id for c in chunks}
            try:
                ran = time.perf_counter()
                self._launched = None
                rows = self.runner.run(
                    chunks, self._device_draws(chunks), on_launch=self._on_launch
                )
                forward = time.perf_counter() - ran
            except RunnerAborted:  # every request in the pass was cancelled (see cancel)
                for c in chunks:
                    self._finish(c.request, FinishReason.CANCELLED)
                continue
            except RunnerError as e:
                log.error("step failed: %s", e)
                for c in chunks:
                    self._finish(c.request, FinishReason.ERROR, error=str(e))
                continue
            finally:
                with self._lock:
                    self._pass_uncancelled = None
                    self.runner.clear_abort()
            # NOTE: cancels that arrived during the forward pass free their slots now; the
            # rows of those requests then carry stale leases and are dropped below.
            if not self._drain(block=False):
                return
            self._postprocess(chunks, rows)
            self._paging_stale = self._paging is not None  # the pass may have moved them
            with self._lock:
                self._steps_run += 1
                self._step_seconds["forward"] += forward
                self._step_seconds["host"] += time.perf_counter() - started - forward
                if self._launched is not None:
                    self._step_seconds["launch"] += self._launched - ran

    def _drain(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued commands (`block`: wait for the first, at most `timeout` seconds when
        given); False when asked to stop."""
        while True:
            try:
                cmd, arg = self._inbox.get(block=block, timeout=timeout)
            except queue.Empty:
                return True
            block = False
            if cmd == "stop":
                return False
            if cmd == "submit":
                self._admit(*arg)
            elif cmd == "clear_prefix":
                assert isinstance(arg, Future)
                self.prefix.clear()
                for slot in self.slots.held():
                    self.slots.drop(slot)
                self._publish()
                arg.set_result(None)
            elif cmd == "cancel":
                live = self._live.get(str(arg))
                if live is not None:
                    self._finish(live.req, FinishReason.CANCELLED)

    def _admit(self, req: Request, prompt: Tokens | None = None) -> None:
        """Queue `req`; `prompt`: its prompt's Tokens, made by the thread that submitted it."""
        if prompt is not None:
            self.prefix.adopt(req, prompt)
        seed = hash((self.config.seed, req.arrival)) & 0xFFFFFFFF
        detok = Detokenizer(self.vocab.token_bytes, req.params.stop)
        self._live[req.request_id] = _Live(req, Sampler(req.params, seed, req.grammar), detok)
        self.scheduler.add(req)

    def _next_arrival(self) -> int:
        with self._lock:
            return next(self._ids)

    def _place(self, req: Request) -> int | None:
        """The free slot `req` should have: one holding a prefix of its prompt (or None)."""
        return self.prefix.place(req, self.slots.held())

    def _start_from_prefix(self, req: Request) -> None:
        """The scheduler leased `req` a slot: start it from the longest prefix held or cached."""
        self._live[req.request_id].prefix = self.prefix.start(req)

    def _empty_slot(self, slot: int) -> None:
        """Forget what the slot holds (once the copies of its rows are done)."""
        self.prefix.forget(slot)
        self.runner.release(slot)

    def _device_draws(self, chunks: list[Chunk]) -> list[dict | None] | None:
        """Per chunk, the parameters of a draw the runner makes where the logits are, or None
        (no draw, or one sampled here from the logits); None when the runner draws nothing."""
        if not self.runner.samples_on_device:
            return None
        draws: list[dict | None] = []
        for c in chunks:
            req = c.request
            sampler = self._live[req.request_id].sampler if c.sample else None
            draws.append(
                sampler.device_draw(
                    self.runner.n_vocab, req.tokens, len(req.prompt), DEVICE_MAX_ADJUST
                )
                if sampler
                else None
            )
        return draws

    def _postprocess(self, chunks: list[Chunk], out: Sequence[np.ndarray | SampleResult]) -> None:
        rows = iter(out)
        generated = 0
        prompt = 0
        sampled: list[tuple[_Live, np.ndarray | SampleResult]] = []
        for c in chunks:
            row = next(rows) if c.sample else None
            req = c.request
            if req.state is not RequestState.RUNNING or not self.slots.is_current(c.lease):
                continue  # stale: the request ended while its batch ran
            if req.num_computed_tokens < len(req.prompt):
                prompt += min(len(c.tokens), len(req.prompt) - req.num_computed_tokens)
            req.num_computed_tokens += len(c.tokens)
            if self.prefix.due(req, c.start):  # the slot holds exactly the tokens computed
                if row is None:
                    self.prefix.snapshot(req)
                else:  # after its first token is out: the head's copy is not in its TTFT
                    self._snapshots_due.append(req)
            elif row is None:  # inside its prompt
                self.prefix.copy_ahead(req)
            if row is None:
                continue
            generated += req.reply_of is None
            sampled.append((self._live[req.request_id], row))
        for (live, _), drawn in zip(sampled, self._sample(sampled), strict=True):
            if isinstance(drawn, Exception):  # e.g. a logit_bias id outside the vocabulary
                log.error("sampling for %s failed", live.req.request_id, exc_info=drawn)
                self._finish(live.req, FinishReason.ERROR, error=f"sampling failed: {drawn}")
            else:
                self._advance(live, *drawn)
        if self._snapshots_due:
            self._deliver()
            self._take_snapshots()
        with self._lock:
            self._prompt_tokens += prompt
            self._generated += generated
            if generated:
                self._recent.append((time.monotonic(), generated))

    def _take_snapshots(self, only: Request | None = None) -> None:
        """Snapshot the slots of the prompts that ended in the last pass (of `only`'s alone when
        given: it is about to end), which still hold exactly their prompts: no pass ran since."""
        due = [r for r in self._snapshots_due if only is None or r is only]
        self._snapshots_due = [r for r in self._snapshots_due if r not in due]
        for req in due:
            self.prefix.snapshot(req)

    def _sample(
        self, sampled: list[tuple[_Live, np.ndarray | SampleResult]]
    ) -> list[tuple[int, TokenLogprob | None] | Exception]:
        """Each request's next token (and logprobs) from its row or its draw on the device, or
        what sampling raised."""

        def one(
            item: tuple[_Live, np.ndarray | SampleResult],
        ) -> tuple[int, TokenLogprob | None] | Exception:
            live, row = item
            try:
                return live.sampler.next_token(row, live.req.tokens, len(live.req.prompt))
            except Exception as e:
                return e

        # NOTE: only host rows go to the pool: a draw made on the device is taken in
        # microseconds, and handing it to a thread cost 0.2 ms a step in waits for 8 rows
        if sum(not isinstance(row, SampleResult) for _, row in sampled) < 2:
            return [one(item) for item in sampled]
        return list(self._samplers.map(one, sampled))

    def _advance(self, live: _Live, token: int, lp: TokenLogprob | None) -> None:
        """Append a running request's next token and emit it."""
        req, params = live.req, live.req.params
        if req.reply_of is not None:  # its prompt is in, and snapshotted: all it was for
            self._finish(req, FinishReason.LENGTH)
            return
        req.tokens.append(token)
        if (not params.ignore_eos and self.vocab.is_eog(token)) or token in params.stop_token_ids:
            self._finish(req, FinishReason.STOP, text=live.detok.flush())
            return
        text, hit = live.detok.add(token)
        self._emit(req, Delta(req.request_id, text, (token,), (lp,) if lp else ()))
        if hit:
            self._finish(req, FinishReason.STOP)
        elif len(req.tokens) >= req.max_len:
            self._finish(req, FinishReason.LENGTH, text=live.detok.flush())

    def _finish(
        self, req: Request, reason: FinishReason, text: str = "", error: str | None = None
    ) -> None:
        if req.state is RequestState.FINISHED:
            return
        if any(r is req for r in self._snapshots_due):  # it ends at its first token: out first
            self._deliver()
        self._take_snapshots(req)  # while its slot holds its prompt (its reply request needs it)
        replied = reason in (FinishReason.STOP, FinishReason.LENGTH)
        # a slot whose request ended well holds its sequence on, for a reuse in place; after a
        # cancel or an error it may hold a half-computed pass
        keep = replied and self.prefix.enabled and req.num_computed_tokens > 0
        running = req.state is RequestState.RUNNING
        live = self._live.pop(req.request_id)
        live.sampler.close()
        # the reply's state as a prompt's, for the next turn, only while no other request runs
        # or waits. NOTE: it costs the engine thread a head load and a snapshot and its slot a
        # pass, which other requests' steps and a follow-up waiting for that slot would wait
        # for; without it, the next turn resumes at its prompt's end in the slot and computes
        # the reply with its new tokens (exactly the same state: prompt chunks split anywhere)
        again = None
        busy = self.scheduler.waiting or any(r is not req for r in self.scheduler.running)
        if req.reply_of is None and replied and not busy:
            again = self.prefix.reply_request(req, self._next_arrival())
        self.prefix.end(req, live.prefix, keep and running)
        self.scheduler.finish(req, keep)
        if req.reply_of is not None:
            return  # the engine's own request: nothing to count or tell
        if again is not None:
            self._admit(again)
        with self._lock:
            self._in_flight -= 1
            self._finished[reason.value] += 1
        ev = Finished(
            req.request_id,
            reason,
            len(req.prompt),
            req.num_output_tokens,
            text=text,
            error=error,
            cached_tokens=req.cached_tokens,
        )
        self._emit(req, ev)

    def _on_launch(self) -> None:
        """The pass is under way: hand over the last step's events and publish the figures as
        of that step (the paging counters wait for the device: at most once a second)."""
        self._launched = time.perf_counter()
        self._deliver()
        self._publish(counters=True)

    def _emit(self, req: Request, ev: Delta | Finished) -> None:
        self._outbox.append((req, ev))

    def _deliver(self) -> None:
        """Hand the events emitted so far to their sinks.

        NOTE: a sink wakes its consumer's thread (the server's event loop), which then competes
        for the GIL, taking it at the native calls of the engine's host work when woken in the
        middle of a step. Handed over as the forward pass gets under way (Runner.run's
        on_launch), the consumers' work overlaps the pass: host time 0.35 -> 0.21 ms a step with
        8 streams in bench/serve_sim.py here. A step's events leave a step later (its host
        time). So the GIL costs the engine next to nothing: in bench/serve_sim.py --load (a 9.35
        ms pass, 8 streams, 2-core CPU, bench/cuda_calls.c's GIL waits preloaded) the engine
        thread waits 0.02-0.04 ms a step for the GIL while the event loop spends 1.3-1.7 ms of CPU
        a step inside the pass: 10.02-10.22 ms a step, 9.93-9.97 without the server (--bare), the
        rest the 2 cores shared with the client. A switch interval (sys.setswitchinterval) of 1
        ms changed nothing, 0.5 ms cost more waits (10.15-10.23 ms a step)."""
        out, self._outbox = self._outbox, []
        for req, ev in out:
            try:
                req.sink(ev)
            except Exception:
                # NOTE: a consumer that went away (closed event loop) must not take the engine
                # thread down; its request is cancelled after the pass (this may run inside one).
                log.exception("event sink of %s failed; cancelling it", req.request_id)
                req.sink = lambda ev: None
                if not isinstance(ev, Finished):
                    self._broken_sinks.append(req)

    def _cancel_broken_sinks(self) -> None:
        broken, self._broken_sinks = self._broken_sinks, []
        for req in broken:
            self._finish(req, FinishReason.CANCELLED)

    def _publish(self, counters: bool = False, force: bool = False) -> None:
        """Figures for stats(), read here, on the thread that owns the runner: the ledger each
        time. `counters` (after a forward pass): the paging counters too, which move only in
        one and wait for the device to read, so at most once per PAGING_READ_INTERVAL_S
        (`force`: now); between reads stats() keeps the last ones."""
        ledger = self.runner.ledger()
        paging, layers = self._paging, self._paging_layers
        if counters:
            now = time.monotonic()
            if force or now >= self._paging_due:
                paging, layers = self.runner.paging_stats(), self.runner.paging_layers()
                self._paging_due = now + PAGING_READ_INTERVAL_S
                self._paging_stale = False
            else:
                self._paging_stale = paging is not None
        # NOTE: not in the ledger, whose every figure is back at its start once requests end:
        # the cache holds its bytes on purpose (EngineStats.prefix, until cleared or evicted)
        prefix = self.prefix.stats()
        graphs = self.runner.graph_stats()
        with self._lock:
            self._busy = self.slots.busy
            self._waiting = len(self.scheduler.waiting)
            self._ledger = ledger
            self._prefix_stats = prefix
            self._paging = paging
            self._paging_layers = layers
            self._graphs = graphs
