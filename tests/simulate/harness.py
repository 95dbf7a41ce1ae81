"""A real simulator server (uvicorn, httptools, a free port) in a background thread.

Shared with other tests that need a simulated upstream over real HTTP.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
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
def running_simulator(
    profile: SimulationProfile,
    *,
    model: str = "simulated",
    now: Callable[[], float] | None = None,
) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT``) of a simulator serving ``profile``."""
    with serving(create_simulator_app(profile, model, now=now)) as base_url:
        yield base_url


def wait_for_stats(base_url: str, is_done: Callable[[dict], bool], timeout_s: float = 3.0) -> dict:
    """Polls GET /stats until ``is_done(stats)``; returns the last stats either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = httpx.get(f"{base_url}/stats").json()
        if is_done(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)
