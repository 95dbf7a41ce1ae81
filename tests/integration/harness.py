"""Titan's app served by a real uvicorn in a background thread, for gateway tests over HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from titan.api import create_app
from titan.api.header_deadline import uvicorn_http_protocol
from titan.config import TitanConfig, config_from_mapping
from titan.service import Pipeline

STARTUP_TIMEOUT_S = 30


@contextmanager
def running_titan(config: TitanConfig | dict, *, pipeline: Pipeline | None = None) -> Iterator[str]:
    """The base URL of a ready Titan serving ``config`` (a TitanConfig or its mapping);
    ``pipeline`` replaces the one the config describes (a fake engine, a given storage)."""
    if not isinstance(config, TitanConfig):
        config = config_from_mapping(config, "test config")
    app = create_app(config) if pipeline is None else create_app(config, pipeline=pipeline)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            # uvloop, as `titan serve` runs: on asyncio's loop in this background thread every
            # request took ~44 ms here (0.9 ms with uvloop), which made long tests crawl.
            loop="uvloop",
            http=uvicorn_http_protocol("httptools", config.server.limits.header_timeout_s),
            lifespan="on",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("titan did not become ready")
            try:
                if server.started and httpx.get(f"{base_url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=STARTUP_TIMEOUT_S)
        sock.close()


def deployment_stats(base_url: str, model: str) -> dict[str, dict]:
    return httpx.get(f"{base_url}/stats").json()["models"][model]["deployments"]
