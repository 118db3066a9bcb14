"""Moving one request's events from the engine thread to the HTTP client, and cancelling the
request whenever the client is gone: streamed (SSE) and whole replies."""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import numpy as np
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from pyqsa.engine import (
    Engine,
    EngineStopped,
    Event,
    Finished,
    GrammarError,
    PromptTooLong,
    QueueFull,
    SamplingParams,
)

from .errors import APIError, internal_error
from .metrics import Metrics


class LoopMailbox:
    """Events from the engine thread for the streams of one event loop, handed over with one
    wake-up of the loop however many arrive together (the engine delivers a step's events in
    one go, right before its next forward pass; the loop should then do their work while the
    pass runs, not once per event in the middle of it)."""

    _of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Event], Event]] = []

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopMailbox:
        """The loop's mailbox (made on the loop's thread, at its first use)."""
        box = cls._of_loop.get(loop)
        if box is None:
            box = cls._of_loop[loop] = cls(loop)
        return box

    def post(self, queue: asyncio.Queue[Event], ev: Event) -> None:
        """Any thread: `ev` goes into `queue` on the loop (raises if the loop is closed)."""
        with self._lock:
            wake = not self._pending
            self._pending.append((queue, ev))
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._hand_over)
            except RuntimeError:  # a closed loop: nothing takes these, and each post says so
                with self._lock:
                    self._pending.clear()
                raise

    def _hand_over(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, ev in pending:
            queue.put_nowait(ev)


class EngineStream:
    """One request's events, moved from the engine thread onto the event loop."""

    def __init__(self, engine: Engine, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.mailbox = LoopMailbox.of(asyncio.get_running_loop())
        self.request_id: str | None = None
        self.closed = False
        metrics.open_requests.inc()

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams,
        snapshot_at: int | None = None,
        ids: np.ndarray | None = None,
    ) -> None:
        try:
            self.request_id = self.engine.submit(
                prompt, params, self._sink, snapshot_at=snapshot_at, ids=ids
            )
        except PromptTooLong as e:
            self.metrics.refused.labels("400").inc()
            raise APIError(400, str(e), code="context_length_exceeded") from e
        except QueueFull as e:
            self.metrics.refused.labels("429").inc()
            raise APIError(429, str(e), code="queue_full") from e
        except EngineStopped as e:
            raise APIError(503, str(e)) from e
        except GrammarError as e:  # from response_format or a forcing tool_choice
            raise APIError(400, f"the reply's grammar: {e}") from e
        except ValueError as e:  # e.g. an empty prompt
            raise APIError(400, str(e), param="prompt") from e

    def _sink(self, ev: Event) -> None:
        self.mailbox.post(self.queue, ev)

    async def next(self) -> Event:
        ev = await self.queue.get()
        if isinstance(ev, Finished):
            self.request_id = None  # nothing left to cancel
        return ev

    def close(self) -> None:
        """Cancel the request if it still runs; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.request_id is not None:
            self.engine.cancel(self.request_id)
        self.metrics.open_requests.dec()


class WholeReply(Response):
    """A non-streamed reply: its JSON is sent when `produce` returns; if the client hangs up
    first, the wait is cancelled and so is the request.

    NOTE: uvicorn does not cancel a handler whose client went away; listening on the ASGI
    channel while waiting is what notices a disconnect at once.
    """

    def __init__(self, produce: Callable[[], Awaitable[dict]], stream: EngineStream) -> None:
        super().__init__()
        self.produce = produce
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        result: JSONResponse | None = None
        try:
            async with anyio.create_task_group() as tg:

                async def work() -> None:
                    nonlocal result
                    try:
                        result = JSONResponse(await self.produce())
                    except APIError as e:
                        result = e.response()
                    tg.cancel_scope.cancel()

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(work)
                tg.start_soon(watch)
        finally:
            self.stream.close()
        if result is not None:
            await result(scope, receive, send)


def sse_response(
    events: AsyncIterator[dict], stream: EngineStream, where: str
) -> EventSourceResponse:
    """Server-sent events of JSON objects, then [DONE]; the stream is closed however it ends
    (sse-starlette cancels the generator when the client disconnects). An error after the
    first event ends the stream with an error event and no [DONE]."""

    async def body() -> AsyncIterator[dict]:
        try:
            async for obj in events:
                yield {"data": json.dumps(obj, ensure_ascii=False)}
            yield {"data": "[DONE]"}
        except APIError as e:
            yield {"data": json.dumps(e.body())}
        except Exception as e:
            yield {"data": json.dumps(internal_error(e, where).body())}
        finally:
            stream.close()

    return EventSourceResponse(body(), ping=15, background=BackgroundTask(stream.close))
