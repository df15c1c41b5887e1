"""Request-size limits: one big request must not stall the server or grow it without bound.

`BodyLimit` (ASGI middleware) answers 413 before the body is read when Content-Length exceeds
the limit, and stops reading a chunked body as soon as it does; a body whose next bytes do not
arrive within `body_timeout_s` (an idle client), or that is not complete `body_deadline_s` after
the request began (a client trickling a byte now and then), ends the request with 408
(`BodyTimeout`; the wait for a disconnect after the body is untimed); `check_prompt_chars` refuses a
prompt that cannot fit the context before it is tokenized (tokenizing runs off the event loop,
see app.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dlmrt.server.errors import error_body

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024  # 8 MiB: far above any prompt a context holds
BODY_TIMEOUT_S = 30.0  # longest wait for a request body's next bytes
BODY_DEADLINE_S = 120.0  # longest time for a whole body (8 MiB in it: 70 KB/s at least)


class BodyTimeout(Exception):
    """The client sent part of a body, then nothing for `body_timeout_s`, or not all of it within
    `body_deadline_s`."""


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    """Reject HTTP request bodies over `max_bytes` with 413 (OpenAI-style error body)."""

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        on_reject: Callable[[Scope], None] | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        body_deadline_s: float = BODY_DEADLINE_S,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_request_bytes: must be >= 1, got {max_bytes}")
        for name, value in (
            ("body_timeout_s", body_timeout_s),
            ("body_deadline_s", body_deadline_s),
        ):
            if not 0 < value < float("inf"):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value}")
        self.app, self.max_bytes, self.on_reject = app, max_bytes, on_reject
        self.body_timeout_s, self.body_deadline_s = body_timeout_s, body_deadline_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        receive = _timed(receive, self.body_timeout_s, self.body_deadline_s)
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_bytes:  # never read: the server discards what follows
                return await self._reject(scope, send, f"{declared} bytes")
            return await self.app(scope, receive, send)  # the server enforces Content-Length
        chunks, size = [], 0
        while True:  # chunked: buffer up to the limit, then hand the app the whole body
            try:
                message = await receive()
            except BodyTimeout as e:
                return await _answer(send, 408, str(e))
            if message["type"] != "http.request":
                return None  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._reject(scope, send, f"more than {self.max_bytes} bytes")
            if not message.get("more_body", False):
                break
        return await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _reject(self, scope: Scope, send: Send, size: str) -> None:
        if self.on_reject is not None:
            self.on_reject(scope)
        message = (
            f"request body: {size} exceed the server's limit of {self.max_bytes} bytes "
            "(dlmrt serve --max-request-bytes)"
        )
        await _answer(send, 413, message, "request_too_large")


def _timed(receive: Receive, timeout_s: float, deadline_s: float) -> Receive:
    """`receive`, each wait for the body's next bytes bounded by `timeout_s` and the whole body by
    `deadline_s` from now (BodyTimeout); once the body is complete, later calls (disconnect
    detection) wait as long as they need."""
    done, end = False, time.monotonic() + deadline_s

    async def timed() -> dict[str, Any]:
        nonlocal done
        if done:
            return await receive()
        left = end - time.monotonic()
        try:
            message = await asyncio.wait_for(receive(), max(0.0, min(timeout_s, left)))
        except TimeoutError:
            if left < timeout_s:
                raise BodyTimeout(f"request body: not complete within {deadline_s} s") from None
            raise BodyTimeout(f"request body: no bytes for {timeout_s} s") from None
        done = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return timed


async def _answer(send: Send, status: int, message: str, code: str | None = None) -> None:
    """An OpenAI-style error answered by the middleware itself, closing the connection (the
    body it did not read makes it unusable)."""
    body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects a malformed header itself
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()  # later calls: disconnect detection
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
