"""A deadline for a request's line and headers: a slow or idle client cannot hold a connection.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but it arms no timer
before a connection's first request nor while a request's headers arrive: a client that connects
and sends nothing, or one header byte every few seconds, keeps its connection (and a file
descriptor) for ever. `header_deadline_protocol` is uvicorn's h11 protocol with one more timer:
armed when a connection opens and when a response completes (waiting for the next request), and
cancelled once a request's headers are parsed; when it fires, the client gets `408 Request
Timeout` and the connection is closed. The body has its own timeout (`limits.BodyTimeout`); a long
streamed answer is not affected by either.
"""

from __future__ import annotations

import asyncio

HEADER_TIMEOUT_S = 30.0  # longest wait for a request's line and headers

_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def header_deadline_protocol(timeout_s: float = HEADER_TIMEOUT_S) -> type:
    """uvicorn's H11Protocol with a `timeout_s` deadline on each request's line and headers
    (pass it as `uvicorn.Config(http=...)`)."""
    if not timeout_s > 0:
        raise ValueError(f"header timeout: must be > 0 seconds, got {timeout_s}")
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline: asyncio.TimerHandle | None = None
            self._arm()

        def data_received(self, data: bytes) -> None:
            waiting = self.cycle
            super().data_received(data)
            if self.cycle is not waiting:  # a request's headers were parsed: a new cycle
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers get the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if getattr(self, "_deadline", None) is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being answered: its body has its own timeout
            msg = f"request headers: none complete within {timeout_s:g} s".encode()
            self.transport.write(_ANSWER % (len(msg), msg))
            self.transport.close()

    return HeaderDeadline
