"""Servers for the load generator's tests: an ASGI app on a real uvicorn (uvloop, httptools) in a
background thread, the simulator, and a tiny backend with a fixed capacity."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import uvicorn

from titan.config import SimulationProfile
from titan.simulate.server import create_simulator_app

STARTUP_TIMEOUT_S = 10


@contextmanager
def serving(app: Any, *, lifespan: str = "on") -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT``) of ``app`` served on a free port. uvloop, as in
    production: asyncio's loop in a background thread delays answers by tens of ms."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan=lifespan,
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=STARTUP_TIMEOUT_S)
        sock.close()


@contextmanager
def simulator(profile: SimulationProfile, model: str = "sim-model") -> Iterator[str]:
    with serving(create_simulator_app(profile, model)) as base_url:
        yield base_url


class CapacityBackend:
    """An OpenAI-shaped backend that serves ``capacity`` requests at a time, each for
    ``service_s``; the others wait their turn (first come, first served). Closed-loop load
    above the capacity therefore waits a whole service time more per request: a known knee."""

    def __init__(self, capacity: int, service_s: float, completion_tokens: int = 4):
        self.capacity, self.service_s = capacity, service_s
        self.answer = orjson.dumps(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "capped",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "one two three four"},
                    }
                ],
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": completion_tokens,
                    "total_tokens": 7 + completion_tokens,
                },
            }
        )
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"].endswith("/models"):
            await _send_json(send, b'{"object":"list","data":[{"id":"capped"}]}')
            return
        if self._slots is None:  # made on the server's loop
            self._slots = asyncio.Semaphore(self.capacity)
        async with self._slots:
            await asyncio.sleep(self.service_s)
        await _send_json(send, self.answer)


async def _send_json(send: Any, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
