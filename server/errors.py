"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with a stable type.

Bad input of any kind maps to a 4xx with one of the types below; a 500 means a bug.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("pyqsa.server")

INVALID_REQUEST = "invalid_request_error"  # 400
AUTHENTICATION = "authentication_error"  # 401
NOT_FOUND = "not_found_error"  # 404
REQUEST_TOO_LARGE = "request_too_large"  # 413
RATE_LIMIT = "rate_limit_error"  # 429: every slot busy and the wait queue full
SERVER = "server_error"  # 500 / 503

_TYPE_BY_STATUS = {
    400: INVALID_REQUEST,
    401: AUTHENTICATION,
    404: NOT_FOUND,
    405: INVALID_REQUEST,
    413: REQUEST_TOO_LARGE,
    429: RATE_LIMIT,
}
# seconds a client refused with 429 should wait before it tries again
RETRY_AFTER_S = 1


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode()


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        # NOTE: a message or param may quote the request, and a lone surrogate in it would
        # make the error itself unencodable
        self.message = _encodable(message)
        self.type = type or _TYPE_BY_STATUS.get(status, SERVER)
        self.param = None if param is None else _encodable(param)
        self.code = code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        headers = dict(headers or {})
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if self.status == 429:
            headers["Retry-After"] = str(RETRY_AFTER_S)
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if e.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    param = ".".join(loc) or None
    where = f"'{param}': " if param else ""
    return f"{where}{e.get('msg', 'invalid value')}", param


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return APIError(exc.status_code, message).response()


class BodyLimit:
    """ASGI middleware: refuse request bodies over `max_bytes` with a 413, declared or not."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = APIError(413, f"the request body exceeds {self.max_bytes} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await too_large.response()(scope, receive, send)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    # NOTE: FastAPI re-raises HTTPExceptions from body reading (anything
                    # else becomes a 400); the handler above turns it into the 413.
                    raise HTTPException(413, too_large.message)
            return msg

        await self.app(scope, limited, send)


class CatchAll:
    """ASGI middleware: an exception no handler took (a bug) is logged once, with its traceback
    and without the request body, and answered with an OpenAI-shaped 500 that closes the
    connection.

    NOTE: Starlette's own handler for Exception re-raises after answering, so uvicorn logs the
    error again and drops the keep-alive connection without `Connection: close`: the client's
    next request on it is reset.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            bug = internal_error(e, f"{scope['method']} {scope['path']}")
            if started:
                return  # mid-reply: uvicorn closes the connection, the only honest end
            await bug.response({"Connection": "close"})(scope, receive, send)


def internal_error(exc: Exception, where: str) -> APIError:
    """Log a bug once (traceback, no request body) and describe it to the client."""
    log.error("internal error in %s", where, exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}")
