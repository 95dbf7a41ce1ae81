"""Serializing answers: JSON bodies, and SSE streams that stop their work when the client leaves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from titan.api.disconnect import ClientDisconnected, unless_disconnected, wait_for_disconnect
from titan.api.errors import error_body
from titan.errors import TitanError
from titan.protocol.sse import DONE, KEEP_ALIVE, encode_event
from titan.service import close_stream

logger = logging.getLogger("titan.api")

KEEP_ALIVE_INTERVAL_S = 15.0
# nginx's code for "client closed request": never seen by the client, but shows in access logs.
CLIENT_CLOSED_REQUEST = 499

_EXHAUSTED: Any = object()


def json_response(payload: BaseModel, status_code: int = 200) -> Response:
    return Response(
        payload.model_dump_json(), status_code=status_code, media_type="application/json"
    )


async def _next(events: AsyncIterator[bytes]) -> bytes:
    return await anext(events, _EXHAUSTED)


def _body_message(body: bytes, is_last: bool = False) -> Message:
    return {"type": "http.response.body", "body": body, "more_body": not is_last}


class EventStreamResponse(Response):
    """``text/event-stream`` over an async iterator of already-framed events.

    Unlike Starlette's StreamingResponse it always watches for the client's disconnect and then
    closes the iterator at once (which aborts the engine requests behind it), and it sends a
    keep-alive comment when no event came for a while.
    """

    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncIterator[bytes], *, keep_alive_interval_s: float = KEEP_ALIVE_INTERVAL_S
    ):
        self.events = events
        self.keep_alive_interval_s = keep_alive_interval_s
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        sending = asyncio.ensure_future(self._send_events(send))
        watching = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sending.cancel()
            watching.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
            await close_stream(self.events)  # in case _send_events never started
        if not sending.cancelled() and sending.exception() is not None:
            raise sending.exception()  # type: ignore[misc]

    async def _send_events(self, send: Send) -> None:
        pending: asyncio.Future[bytes] | None = None
        try:
            while True:
                pending = asyncio.ensure_future(_next(self.events))
                while not (await asyncio.wait({pending}, timeout=self.keep_alive_interval_s))[0]:
                    await send(_body_message(KEEP_ALIVE))
                event, pending = pending.result(), None
                if event is _EXHAUSTED:
                    break
                await send(_body_message(event))
            await send(_body_message(b"", is_last=True))
        finally:
            # The iterator cannot be closed while a __anext__ is running on it.
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await close_stream(self.events)


async def sse_events(chunks: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    """Frame each chunk as an SSE event, then ``[DONE]``. An error after the stream started can
    no longer change the status code: it becomes an ``{"error": ...}`` event before ``[DONE]``."""
    try:
        async for chunk in chunks:
            yield encode_event(chunk)
    except TitanError as exc:
        logger.warning("stream failed: %s", exc.message, extra={"code": exc.code})
        yield encode_event(error_body(exc))
    except Exception as exc:
        logger.exception("stream failed")
        yield encode_event(error_body(exc))
    finally:
        await close_stream(chunks)
    yield DONE


async def answer(request: Request, result: Awaitable[BaseModel]) -> Response:
    """A JSON answer; the work is cancelled if the client disconnects while waiting."""
    try:
        return json_response(await unless_disconnected(request.receive, result))
    except ClientDisconnected:
        logger.info("client disconnected before the answer", extra={"path": request.url.path})
        return Response(status_code=CLIENT_CLOSED_REQUEST)


async def answer_stream(
    request: Request, started_stream: Awaitable[AsyncIterator[BaseModel]]
) -> Response:
    """An SSE answer. ``started_stream`` raises the errors that come before the first chunk, so
    those are still plain JSON errors with their status code."""
    try:
        chunks = await unless_disconnected(request.receive, started_stream)
    except ClientDisconnected:
        logger.info("client disconnected before the stream", extra={"path": request.url.path})
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return EventStreamResponse(sse_events(chunks))
