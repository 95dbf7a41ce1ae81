"""Redis fixtures for any test package: import them into its conftest.py::

    from tests.redis_server import redis_prefix, redis_server, redis_url  # noqa: F401

``redis_server`` (session): ``redis://127.0.0.1:PORT`` of the Redis answering on 6379, or else of a
``redis-server`` started for the session. ``redis_url`` adds the test database; ``redis_prefix`` is
a fresh key prefix whose keys are deleted after the test. No Redis at all fails the test (never
skips): the ``redis`` mark means "needs a real Redis", and a missing one is a broken setup.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

HOST = "127.0.0.1"
DEFAULT_PORT = 6379
# Tests use their own database, so a developer's keys in db 0 are never touched; each pytest-xdist
# worker (gw0, gw1, ...) its own, since a test may clear or count every key of its database.
FIRST_TEST_DB = 9
MAX_WORKERS = 16 - FIRST_TEST_DB  # Redis has databases 0-15
START_TIMEOUT_S = 10.0


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    if answers_ping(DEFAULT_PORT):
        yield f"redis://{HOST}:{DEFAULT_PORT}"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(f"no Redis answers at {HOST}:{DEFAULT_PORT} and redis-server is not installed")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers_ping(port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server on port {port} did not start (exit {process.poll()})")
            time.sleep(0.05)
        yield f"redis://{HOST}:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def worker_db() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw"))
    if index >= MAX_WORKERS:
        pytest.fail(f"at most {MAX_WORKERS} pytest-xdist workers: one Redis database each")
    return FIRST_TEST_DB + index


@pytest.fixture
def redis_url(redis_server: str) -> str:
    return f"{redis_server}/{worker_db()}"


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    import redis

    prefix = f"titan-test:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
