"""The load generator's HTTP client: keep-alive connections on asyncio streams (uvloop's when the
caller runs one), pooled, and one request's exchange timed into a Sample.

Lean on purpose: at 1,000 requests/s a client library's per-request cost (httpx's in particular)
would be a core of its own. Each read is parsed whole (wire.ResponseParser), so a stream costs
a few microseconds per read, not per byte or line.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from dataclasses import dataclass

from titan.loadgen.wire import Endpoint, PreparedRequest, ResponseParser

READ_SIZE = 256 * 1024
TRANSPORT_FAILURE = 0  # Sample.status of a request that got no complete HTTP answer
NOT_SENT = "not sent: too many requests in flight"


@dataclass(frozen=True)
class LoadTarget:
    base_url: str  # e.g. "http://127.0.0.1:8000/v1"; without the /v1 it is added
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class Sample:
    """One request's outcome. Times in seconds."""

    sent_s: float  # from the run's start to when it was sent
    status: int  # the HTTP status; TRANSPORT_FAILURE: refused, reset, cut, timeout, not sent
    e2e_s: float  # from the send to the answer's last byte
    ttft_s: float | None  # send -> first token (non-streaming: == e2e_s); None when failed
    output_tokens: int  # usage.completion_tokens when reported, else token-bearing chunks
    prompt_tokens: int  # usage.prompt_tokens when reported, else 0
    itl_s: tuple[float, ...]  # gaps between consecutive token-bearing chunks (streams only)
    error: str | None = None  # why it failed: the status line's reason, or the exception

    @property
    def is_ok(self) -> bool:
        return 200 <= self.status < 300 and self.error is None


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class ConnectionPool:
    """Idle keep-alive connections to one endpoint, reused newest first; a request with none
    idle opens one. Unbounded: the runner bounds the requests in flight."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if endpoint.scheme == "https" else None
        self.num_opened = 0

    async def _open(self) -> _Connection:
        host = self.endpoint.host
        server_hostname = host if self._ssl else None
        reader, writer = await asyncio.open_connection(
            host,
            self.endpoint.port,
            ssl=self._ssl,
            server_hostname=server_hostname,
            limit=READ_SIZE,
        )
        self.num_opened += 1
        return _Connection(reader, writer)

    def release(self, connection: _Connection, is_reusable: bool) -> None:
        if is_reusable:
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def fetch(
        self, data: bytes, is_stream: bool, clock: _Clock | None = None
    ) -> ResponseParser:
        """Send ``data`` and read the whole response (a new connection's connect counts in
        its time). When a reused connection turns out to have been closed by the server while
        idle (EOF or reset before any answer byte), the request goes again on another one, timed
        from then. Raises OSError, EOFError or ValueError on transport trouble."""
        while True:
            is_reused = bool(self._idle)
            connection = self._idle.pop() if is_reused else await self._open()
            parser = ResponseParser(is_stream)
            try:
                await _exchange(connection, data, parser)
            except (OSError, EOFError, ValueError) as exc:
                connection.close()
                if is_reused and parser.status == 0 and not isinstance(exc, ValueError):
                    if clock is not None:
                        clock.restart()
                    continue  # a stale keep-alive connection: the server never saw it
                raise
            except BaseException:  # a timeout or cancellation: the connection's state is unknown
                connection.close()
                raise
            self.release(connection, parser.is_keep_alive)
            return parser


async def _exchange(connection: _Connection, data: bytes, parser: ResponseParser) -> None:
    connection.writer.write(data)
    read = connection.reader.read
    clock = time.perf_counter
    while True:
        chunk = await read(READ_SIZE)
        now = clock()
        if not chunk:
            if parser.feed_eof(now):
                return
            raise EOFError("connection closed mid-answer")
        if parser.feed(chunk, now):
            return


class _Clock:
    """When the request was (re)sent, so that a retry on a fresh connection is timed from its
    own send."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = time.perf_counter()

    def restart(self) -> None:
        self.sent = time.perf_counter()


async def send(
    pool: ConnectionPool, request: PreparedRequest, run_start: float, timeout_s: float
) -> Sample:
    """One request, timed: never raises for the server's or the network's failures (they become
    samples with an error)."""
    clock = _Clock()
    sent_s = clock.sent - run_start
    try:
        async with asyncio.timeout(timeout_s):
            parser = await pool.fetch(request.data, request.is_stream, clock)
    except TimeoutError:
        return failed(sent_s, time.perf_counter() - clock.sent, "timeout")
    except (OSError, EOFError, ValueError) as exc:
        return failed(sent_s, time.perf_counter() - clock.sent, type(exc).__name__)
    done = time.perf_counter()
    sent = clock.sent
    times = parser.token_times
    num_tokens = parser.completion_tokens if parser.completion_tokens is not None else len(times)
    is_ok = 200 <= parser.status < 300 and parser.error is None
    ttft: float | None = None
    if is_ok:
        ttft = times[0] - sent if request.is_stream and times else done - sent
    return Sample(
        sent_s=sent - run_start,
        status=parser.status,
        e2e_s=done - sent,
        ttft_s=ttft,
        output_tokens=num_tokens,
        prompt_tokens=parser.prompt_tokens or 0,
        itl_s=tuple(later - earlier for earlier, later in itertools.pairwise(times)),
        error=parser.error,
    )


def failed(sent_s: float, e2e_s: float, error: str) -> Sample:
    return Sample(sent_s, TRANSPORT_FAILURE, e2e_s, None, 0, 0, (), error)
