"""The header deadline `titan serve` adds to uvicorn: slow or absent headers lose the connection
with a 408; ordinary and keep-alive requests are untouched."""

from __future__ import annotations

import socket
import time

import orjson
import pytest

from tests.integration.harness import running_titan

TIMEOUT_S = 0.6
# asyncio runs a timer up to its clock resolution early (seen: closed after 0.5996 s).
EARLY_S = 0.01
CONFIG = {
    "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
    "server": {"limits": {"header_timeout_s": TIMEOUT_S}},
}


@pytest.fixture(scope="module")
def address():
    with running_titan(CONFIG) as base_url:
        host, port = base_url.removeprefix("http://").split(":")
        yield host, int(port)


def _connect(address) -> socket.socket:
    return socket.create_connection(address, timeout=5)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_trickled_headers_get_408_and_the_connection_closes(address):
    with _connect(address) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        # A header line every 0.2 s: each byte would reset uvicorn's own keep-alive timer.
        try:
            for index in range(20):
                time.sleep(0.2)
                sock.sendall(f"x-slow-{index}: 1\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = _read_all(sock)
    elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    error = orjson.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"
    assert "server.limits.header_timeout_s" in error["message"]
    assert TIMEOUT_S - EARLY_S <= elapsed < TIMEOUT_S + 2


def test_a_connection_that_sends_nothing_is_closed(address):
    with _connect(address) as sock:
        started = time.monotonic()
        assert _read_all(sock) == b""
    assert TIMEOUT_S - EARLY_S <= time.monotonic() - started < TIMEOUT_S + 2


def test_keep_alive_requests_each_get_a_fresh_deadline(address):
    request = b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n"
    with _connect(address) as sock:
        for _ in range(3):
            sock.sendall(request)
            reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            # Idle past the header deadline between requests: the idle time is keep-alive's (5 s),
            # and the next request's deadline starts at its first byte.
            time.sleep(TIMEOUT_S * 1.3)


def test_headers_split_over_several_packets_in_time_are_served(address):
    parts = (b"GET /health HTTP/1.1\r\n", b"host: t\r\n", b"connection: close\r\n\r\n")
    with _connect(address) as sock:
        for part in parts:
            sock.sendall(part)
            time.sleep(TIMEOUT_S / 5)
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
