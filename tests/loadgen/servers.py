"""Servers for the load generator's tests: the simulator and a tiny backend with a fixed
capacity, each on a real uvicorn in a background thread (tests/simulate/harness.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from tests.simulate.harness import serving
from titan.config import SimulationProfile
from titan.simulate.server import create_simulator_app


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
