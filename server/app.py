"""The OpenAI-compatible HTTP app around a running engine.

Templating, tokenization and JSON shaping happen here, on the event loop (tokenization in a
worker thread); the engine sees token ids and SamplingParams and streams typed events back.
Control tokens come only from the chat template (chat_prompt.py), or from a completions
prompt that asks for them (`parse_special`).
Every completion request owns an `EngineStream`; closing it (reply done, client gone,
handler error) cancels the request in the engine and so frees its slot.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from pyqsa.engine import Delta, Engine, Finished, FinishReason, TokenLogprob

from . import errors
from .chat_prompt import ChatPrompt, PlainTokenizer
from .chat_template import OPEN, ChatTemplate, ParsedToolCall, ToolCallStream, parse_tool_calls
from .errors import APIError
from .json_body import JSONRoute
from .metrics import Metrics
from .protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    Shaper,
    token_ids,
    usage,
)
from .streams import EngineStream, WholeReply, sse_response


class Tokenizer(PlainTokenizer, Protocol):
    n_vocab: int

    def token_bytes(self, token: int) -> bytes: ...


def _template_message(m: ChatMessage) -> dict:
    d: dict = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
    if m.name:
        d["name"] = m.name
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        calls = []
        for tc in m.tool_calls:
            try:
                args = json.loads(tc.function.arguments)
            except json.JSONDecodeError:
                args = tc.function.arguments
            calls.append(
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.function.name, "arguments": args},
                }
            )
        d["tool_calls"] = calls
    return d


@asynccontextmanager
async def _load_anyio(app: FastAPI) -> AsyncIterator[None]:
    # NOTE: anyio imports its asyncio backend on first use, which would be the first reply's
    # task group (~15 ms of imports, on the event loop, in that request's time to first token)
    await anyio.sleep(0)
    yield


def create_app(
    engine: Engine,
    tokenizer: Tokenizer,
    model_name: str,
    template: ChatTemplate,
    api_key: str | None = None,
    max_body_bytes: int = 8 << 20,
    default_max_tokens: int = 1024,
) -> FastAPI:
    """default_max_tokens: the output limit of requests that set none."""
    app = FastAPI(
        title="pyqsa", docs_url=None, redoc_url=None, openapi_url=None, lifespan=_load_anyio
    )
    app.router.route_class = JSONRoute
    errors.install(app)
    app.add_middleware(errors.BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(errors.CatchAll)  # outermost: sees whatever no handler took
    chat_prompt = ChatPrompt(template, tokenizer)
    metrics = Metrics(engine)
    created = int(time.time())

    async def auth(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            raise APIError(401, "missing API key (Authorization: Bearer ...)")
        if not hmac.compare_digest(header[len("Bearer ") :].encode(), api_key.encode()):
            raise APIError(401, "invalid API key", code="invalid_api_key")

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(
                404,
                f"model {name!r} does not exist; this server has {model_name!r}",
                param="model",
                code="model_not_found",
            )

    def piece(t: int) -> str:
        return tokenizer.token_bytes(t).decode("utf-8", errors="replace")

    def chat_logprobs(lps: list[TokenLogprob]) -> list[dict]:
        def entry(t: int, lp: float) -> dict:
            return {"token": piece(t), "logprob": lp, "bytes": list(tokenizer.token_bytes(t))}

        return [
            {**entry(x.token, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]}
            for x in lps
        ]

    def text_logprobs(lps: list[TokenLogprob], offset: int) -> dict:
        tokens = [piece(x.token) for x in lps]
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [x.logprob for x in lps],
            "top_logprobs": [{piece(t): v for t, v in x.top} for x in lps],
            "text_offset": offsets,
        }

    def finish_reason(ev: Finished, calls: bool) -> str:
        if ev.reason is FinishReason.ERROR:
            raise APIError(500, f"generation failed: {ev.error}")
        if calls:
            return "tool_calls"
        return "length" if ev.reason is FinishReason.LENGTH else "stop"

    async def respond(
        prompt: list[int],
        body: ChatCompletionRequest | CompletionRequest,
        kind: str,
        events: Callable[..., AsyncIterator[dict]],
        reply: Callable[..., Awaitable[dict]],
        t0: float,
        snapshot_at: int | None = None,
        ids: np.ndarray | None = None,
    ) -> Response:
        """Submit the request; stream it as SSE events (events) or answer once it is whole
        (reply). kind: "chat" or "text", the shape of the objects; snapshot_at and ids:
        Engine.submit's."""
        params = body.params(tokenizer.n_vocab, default_max_tokens)
        stream = EngineStream(engine, metrics)
        try:
            stream.submit(prompt, params, snapshot_at, ids)
        except BaseException:
            stream.close()
            raise
        shaper = Shaper(kind, model_name)
        if body.stream:
            return sse_response(events(stream, shaper, body, t0), stream, f"{kind} stream")
        return WholeReply(lambda: reply(stream, shaper, body, t0), stream)

    async def collect(stream: EngineStream, t0: float) -> tuple[str, list[TokenLogprob], Finished]:
        """Wait for a whole reply."""
        parts: list[str] = []
        lps: list[TokenLogprob] = []
        while True:
            ev = await stream.next()
            parts.append(ev.text)
            if isinstance(ev, Finished):
                return "".join(parts), lps, ev
            if len(parts) == 1:
                metrics.ttft.observe(time.monotonic() - t0)
            lps.extend(ev.logprobs)

    @app.get("/health")
    async def health() -> dict:
        s = engine.stats()
        return {
            "status": "ok",
            "slots": s.n_slots,
            "busy_slots": s.busy_slots,
            "waiting": s.waiting,
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "pyqsa",
            "max_model_len": engine.config.ctx_per_slot,
        }

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}", dependencies=[Depends(auth)])
    async def model(name: str) -> dict:
        check_model(name)
        return model_card()

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)], response_model=None)
    async def chat(body: ChatCompletionRequest) -> Response:
        t0 = time.monotonic()
        check_model(body.model)
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []] or None
        messages = [_template_message(m) for m in body.messages]
        prompt, history = await run_in_threadpool(chat_prompt.tokens_and_history, messages, tools)
        if (forced := body.forced_call()) is not None:
            prompt += chat_prompt.call_start(forced)
        return await respond(prompt, body, "chat", chat_events, chat_reply, t0, history)

    def reply_start(body: ChatCompletionRequest) -> str:
        """What the reply starts with before the model's first token: a forced call's start."""
        forced = body.forced_call()
        return "" if forced is None else OPEN + forced

    async def chat_reply(
        stream: EngineStream, shaper: Shaper, body: ChatCompletionRequest, t0: float
    ) -> dict:
        text, lps, fin = await collect(stream, t0)
        text = reply_start(body) + text
        content, calls = parse_tool_calls(text) if body.use_tools() else (text, [])
        message: dict = {
            "role": "assistant",
            "content": content if not calls else (content or None),
        }
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        choice = {
            "message": message,
            "logprobs": {"content": chat_logprobs(lps)} if body.logprobs else None,
            "finish_reason": finish_reason(fin, bool(calls)),
        }
        return shaper.final(choice, usage(fin))

    async def chat_events(
        stream: EngineStream, shaper: Shaper, body: ChatCompletionRequest, t0: float
    ) -> AsyncIterator[dict]:
        with_usage = body.include_usage()
        tools = ToolCallStream() if body.use_tools() else None
        if tools is not None:
            tools.feed(reply_start(body))  # held until the model closes the call
        n_calls = 0
        pending_lp: list[TokenLogprob] = []

        def chunk(delta: dict, finish: str | None = None) -> dict:
            lp = None
            if body.logprobs and "content" in delta:
                lp = {"content": chat_logprobs(pending_lp)}
                pending_lp.clear()
            return shaper.chunk(
                {"delta": delta, "logprobs": lp, "finish_reason": finish}, with_usage
            )

        def pieces(text: str, final: bool) -> list[str | ParsedToolCall]:
            if tools is None:
                return [text] if text else []
            out = tools.feed(text)
            if final and (rest := tools.flush()):
                out.append(rest)
            return out

        yield chunk({"role": "assistant", "content": ""})
        first = True
        while True:
            ev = await stream.next()
            if isinstance(ev, Delta) and first:
                metrics.ttft.observe(time.monotonic() - t0)
                first = False
            if isinstance(ev, Delta):
                pending_lp.extend(ev.logprobs)
            for p in pieces(ev.text, isinstance(ev, Finished)):
                if isinstance(p, str):
                    yield chunk({"content": p})
                else:
                    call = {"index": n_calls, **p.to_openai()}
                    n_calls += 1
                    yield chunk({"tool_calls": [call]})
            if isinstance(ev, Finished):
                yield chunk({}, finish_reason(ev, n_calls > 0))
                if with_usage:
                    yield shaper.chunk(None, True, usage(ev))
                return

    @app.post("/v1/completions", dependencies=[Depends(auth)], response_model=None)
    async def completions(body: CompletionRequest) -> Response:
        t0 = time.monotonic()
        check_model(body.model)
        if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
            if len(body.prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            body.prompt = body.prompt[0]
        if isinstance(body.prompt, str):
            prompt = await run_in_threadpool(tokenizer.tokenize, body.prompt, body.parse_special)
            return await respond(prompt, body, "text", text_events, text_reply, t0)
        ids = token_ids(body.prompt, tokenizer.n_vocab)
        return await respond(body.prompt, body, "text", text_events, text_reply, t0, ids=ids)

    async def text_reply(
        stream: EngineStream, shaper: Shaper, body: CompletionRequest, t0: float
    ) -> dict:
        text, lps, fin = await collect(stream, t0)
        choice = {
            "text": text,
            "logprobs": text_logprobs(lps, 0) if body.logprobs is not None else None,
            "finish_reason": finish_reason(fin, False),
        }
        return shaper.final(choice, usage(fin))

    async def text_events(
        stream: EngineStream, shaper: Shaper, body: CompletionRequest, t0: float
    ) -> AsyncIterator[dict]:
        with_usage = body.include_usage()
        offset = 0
        first = True
        while True:
            ev = await stream.next()
            if isinstance(ev, Delta):
                if first:
                    metrics.ttft.observe(time.monotonic() - t0)
                    first = False
                lp = text_logprobs(list(ev.logprobs), offset) if body.logprobs is not None else None
                offset += len(ev.text)
                if ev.text or lp:
                    choice = {"text": ev.text, "logprobs": lp, "finish_reason": None}
                    yield shaper.chunk(choice, with_usage)
                continue
            choice = {"text": ev.text, "logprobs": None, "finish_reason": finish_reason(ev, False)}
            yield shaper.chunk(choice, with_usage)
            if with_usage:
                yield shaper.chunk(None, True, usage(ev))
            return

    app.state.metrics = metrics
    return app
