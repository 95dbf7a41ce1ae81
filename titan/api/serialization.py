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
from titan.protocol import Answer, ClientRequest, answer_bytes
from titan.protocol.sse import DONE, KEEP_ALIVE, encode_event
from titan.service import Routed, close_stream

logger = logging.getLogger("titan.api")

KEEP_ALIVE_INTERVAL_S = 15.0
# A stream whose first chunk takes longer than this starts anyway, with keep-alive comments.
COMMIT_AFTER_S = 2.0
# nginx's code for "client closed request": never seen by the client, but shows in access logs.
CLIENT_CLOSED_REQUEST = 499


def json_response(payload: BaseModel, status_code: int = 200) -> Response:
    return Response(
        payload.model_dump_json(), status_code=status_code, media_type="application/json"
    )


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
        self,
        events: AsyncIterator[bytes],
        *,
        headers: dict[str, str] | None = None,
        keep_alive_interval_s: float = KEEP_ALIVE_INTERVAL_S,
    ):
        self.events = events
        self.keep_alive_interval_s = keep_alive_interval_s
        self.status_code = 200
        self.background = None
        self.init_headers(
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
        )

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
        # Events go out as they come (no task per event: this is the hot path of every stream);
        # a ticker beside it sends a keep-alive comment whenever the stream has been quiet.
        lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        last_sent = loop.time()

        async def send_body(body: bytes, is_last: bool = False) -> None:
            nonlocal last_sent
            async with lock:
                await send(_body_message(body, is_last))
            last_sent = loop.time()

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(max(0.0, last_sent + self.keep_alive_interval_s - loop.time()))
                if loop.time() - last_sent >= self.keep_alive_interval_s:
                    await send_body(KEEP_ALIVE)

        ticker = asyncio.ensure_future(keep_alive())
        try:
            async for event in self.events:
                await send_body(event)
            await send_body(b"", is_last=True)
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            await close_stream(self.events)


async def sse_events(chunks: AsyncIterator[Answer]) -> AsyncIterator[bytes]:
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


def routed_headers(client_request: ClientRequest, routed: Routed[Any] | None) -> dict[str, str]:
    headers = {"x-request-id": client_request.request_id}
    if routed is not None:
        headers["x-titan-model"] = routed.model
        headers["x-titan-deployment"] = routed.deployment
        headers["x-titan-attempts"] = str(routed.num_attempts)
        headers.update(routed.headers)
    return headers


async def answer(
    request: Request, client_request: ClientRequest, result: Awaitable[Routed[Answer]]
) -> Response:
    """A JSON answer; the work is cancelled if the client disconnects while waiting."""
    try:
        routed = await unless_disconnected(request.receive, result)
    except ClientDisconnected:
        logger.info("client disconnected before the answer", extra={"path": request.url.path})
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return Response(
        answer_bytes(routed.value),
        media_type="application/json",
        headers=routed_headers(client_request, routed),
    )


async def answer_stream(
    request: Request,
    client_request: ClientRequest,
    started: Awaitable[Routed[AsyncIterator[Answer]]],
    commit_after_s: float = COMMIT_AFTER_S,
) -> Response:
    """An SSE answer. Errors before the first chunk are plain JSON errors with their status
    code, as long as the first chunk comes within ``commit_after_s``. After that the response
    starts anyway (200) and sends keep-alive comments while it waits, so that clients and proxies
    with idle timeouts do not give up on a slow first token; a later error becomes an SSE error
    event."""
    starting = asyncio.ensure_future(unless_disconnected(request.receive, started))
    done, _ = await asyncio.wait({starting}, timeout=commit_after_s)
    if not done:
        return EventStreamResponse(
            _after_commit(starting), headers=routed_headers(client_request, None)
        )
    try:
        routed = starting.result()
    except ClientDisconnected:
        logger.info("client disconnected before the stream", extra={"path": request.url.path})
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return EventStreamResponse(
        sse_events(routed.value), headers=routed_headers(client_request, routed)
    )


async def _after_commit(
    starting: asyncio.Future[Routed[AsyncIterator[Answer]]],
) -> AsyncIterator[bytes]:
    try:
        yield KEEP_ALIVE  # at once: the headers alone do not reset every idle timer
        try:
            routed = await starting
        except ClientDisconnected:
            return
        except TitanError as exc:
            logger.warning("stream failed before its first chunk: %s", exc.message)
            yield encode_event(error_body(exc))
            yield DONE
            return
        async for event in sse_events(routed.value):
            yield event
    finally:
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
