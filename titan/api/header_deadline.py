"""A deadline for a request's headers, which uvicorn does not have.

uvicorn cancels its keep-alive timer on every byte received, so a client that sends a header
line every few seconds (slowloris) holds a connection, and a worker's file descriptor, forever;
one that connects and sends nothing is never timed out either. ``with_header_deadline`` wraps
uvicorn's HTTP/1.1 protocol class: the headers of each request must be complete within
``timeout_s`` of the connection opening or of the request's first byte; otherwise the client gets
an OpenAI-style 408 (or, having sent nothing, a plain close) and the connection is closed. The
body has its own deadline (``server.limits.body_timeout_s``, in the app).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


def _timeout_response(timeout_s: float) -> bytes:
    message = (
        f"The request headers did not arrive within {timeout_s:g} s; send the whole header "
        "block at once (the limit is server.limits.header_timeout_s)."
    )
    error = {"message": message, "type": "invalid_request_error", "param": None}
    body = orjson.dumps({"error": {**error, "code": "request_timeout"}})
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def with_header_deadline(base: type[asyncio.Protocol], timeout_s: float) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's ``base`` (httptools or h11 protocol) enforcing the deadline.

    Both of uvicorn's protocols replace ``self.cycle`` when a request's headers are parsed: that
    is how the subclass knows the headers arrived, without depending on either parser's hooks.
    """
    response = _timeout_response(timeout_s)

    class HeaderDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _bytes_seen = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            cycle = getattr(self, "cycle", None)
            waiting_for_request = cycle is None or cycle.response_complete
            if self._header_timer is None and waiting_for_request:
                self._arm_header_timer()  # the first byte of a keep-alive connection's next request
            self._bytes_seen = True
            super().data_received(data)
            if getattr(self, "cycle", None) is not cycle:
                self._disarm_header_timer()  # headers parsed: a new request cycle started

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._bytes_seen = False
            loop = asyncio.get_running_loop()
            self._header_timer = loop.call_later(timeout_s, self._headers_timed_out)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_timed_out(self) -> None:
            self._header_timer = None
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            if self._bytes_seen:
                transport.write(response)
            transport.close()

    HeaderDeadlineProtocol.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadlineProtocol


def uvicorn_http_protocol(http: str, timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's protocol class for ``http`` ("httptools" or "h11"), with the header deadline."""
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return with_header_deadline(base, timeout_s)
