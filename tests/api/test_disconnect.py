"""A client that goes away aborts its engine requests, streaming or not.

httpx's ASGITransport cannot hang up mid-response, so these drive the ASGI app directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette

from tests.api.conftest import make_app
from tests.api.fakes import FakeEngine
from titan.api.serialization import EventStreamResponse

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def slow_app() -> AsyncIterator[tuple[Starlette, FakeEngine]]:
    engine = FakeEngine(token_delay_s=0.005)
    app = make_app(engine)
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        yield app, engine


async def call(
    app: Starlette,
    path: str,
    body: dict[str, Any],
    *,
    hang_up_after_bodies: int | None = None,
    hang_up_after_s: float | None = None,
) -> list[dict[str, Any]]:
    """POST ``body``; the client disconnects after N body messages or after a delay."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("titan.test", 80),
    }
    gone = asyncio.Event()
    has_sent_request = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal has_sent_request
        if not has_sent_request:
            has_sent_request = True
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        bodies = [m for m in sent if m["type"] == "http.response.body"]
        if hang_up_after_bodies is not None and len(bodies) >= hang_up_after_bodies:
            gone.set()

    if hang_up_after_s is not None:
        asyncio.get_running_loop().call_later(hang_up_after_s, gone.set)
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent


@pytest.mark.parametrize("n", [1, 3])
async def test_streaming_disconnect_aborts_in_the_engine(
    slow_app: tuple[Starlette, FakeEngine], n: int
) -> None:
    app, engine = slow_app
    body = {"messages": USER, "stream": True, "max_tokens": 200, "n": n, "ignore_eos": True}
    sent = await call(app, "/v1/chat/completions", body, hang_up_after_bodies=3)
    assert sent[0]["status"] == 200
    assert engine.running == set()
    assert len(engine.aborted) == n and engine.finished == []
    assert not any(m.get("body", b"").startswith(b"data: [DONE]") for m in sent)


async def test_non_streaming_disconnect_aborts_in_the_engine(
    slow_app: tuple[Starlette, FakeEngine],
) -> None:
    app, engine = slow_app
    body = {"prompt": ["a", "b"], "max_tokens": 200, "n": 2}
    await call(app, "/v1/completions", body, hang_up_after_s=0.05)
    assert engine.running == set()
    assert len(engine.aborted) == 4 and engine.finished == []


async def test_completed_stream_is_not_aborted(slow_app: tuple[Starlette, FakeEngine]) -> None:
    app, engine = slow_app
    sent = await call(app, "/v1/completions", {"prompt": "a", "max_tokens": 3, "stream": True})
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert engine.finished and not engine.aborted


async def test_keep_alive_comments_fill_silences() -> None:
    async def slow_events() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.05)
        yield b"data: 1\n\n"

    response = EventStreamResponse(slow_events(), keep_alive_interval_s=0.01)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response({"type": "http"}, receive, send)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies[0] == b": keep-alive\n\n"
    assert bodies[-2:] == [b"data: 1\n\n", b""]


async def test_disconnect_before_the_first_chunk_aborts(engine: FakeEngine) -> None:
    engine.token_delay_s = 1.0  # the first token is far away
    app = make_app(engine)
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        body = {"messages": USER, "stream": True, "max_tokens": 5}
        sent = await call(app, "/v1/chat/completions", body, hang_up_after_s=0.05)
    assert sent[0]["status"] == 499  # no stream was started: nobody is listening anyway
    assert engine.running == set() and len(engine.aborted) == 1
