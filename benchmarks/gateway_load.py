"""Load for the gateway benchmark: closed-loop clients that post one chat body over and over.

Two generators with the same closed-loop shape (``concurrency`` connections, each sending its
next request as soon as the previous answer is read to the end, streams included):
- wrk (C, one thread): the overhead phase's default, so the client takes little of the CPU the
  systems under test share with it;
- a pure-Python client, titan.loadgen's connection pool and response parser (on uvloop when
  installed): the overhead phase's fallback where wrk is missing, and the transients phase's
  client, which alternates hosts per request (wrk cannot) and records every request's status,
  latency and Titan's attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from titan.loadgen.client import ConnectionPool
from titan.loadgen.metrics import percentile
from titan.loadgen.runner import new_event_loop
from titan.loadgen.wire import Endpoint

CHAT = "/chat/completions"  # under the API's /v1
CHAT_PATH = f"/v1{CHAT}"
# A transport failure (reset, refused, cut mid-answer, timeout) in place of an HTTP status.
TRANSPORT_ERROR = 0


def chat_body(model: str, *, is_stream: bool, max_tokens: int = 16) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": max_tokens,
    }
    if is_stream:
        body["stream"] = True
    return orjson.dumps(body)


def chat_request(endpoint: Endpoint, body: bytes, api_key: str | None = None) -> bytes:
    """The bytes of one chat completion request (``endpoint``: the API's base, ``/v1``)."""
    return endpoint.request("POST", CHAT, api_key, body)


# One request: seconds from the load's start, latency in seconds, HTTP status (TRANSPORT_ERROR:
# none), attempts Titan made (its x-titan-attempts header; 0 when absent).
Record = tuple[float, float, int, int]


async def _closed_loop(
    endpoints: Sequence[Endpoint],
    body: bytes,
    api_key: str,
    concurrency: int,
    duration_s: float,
    timeout_s: float,
) -> tuple[list[Record], float]:
    requests = [chat_request(endpoint, body, api_key) for endpoint in endpoints]
    is_stream = orjson.loads(body).get("stream") is True
    pools = [ConnectionPool(endpoint) for endpoint in endpoints]
    turn = itertools.count()  # shared: consecutive requests go to consecutive endpoints
    records: list[Record] = []
    started = time.perf_counter()
    deadline = started + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            index = next(turn) % len(endpoints)
            sent = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    answer = await pools[index].fetch(requests[index], is_stream)
                status = answer.status
                attempts = int(answer.headers.get("x-titan-attempts", "0") or 0)
            except (OSError, EOFError, ValueError, TimeoutError):
                status, attempts = TRANSPORT_ERROR, 0
            done = time.perf_counter()
            records.append((sent - started, done - sent, status, attempts))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        for pool in pools:
            pool.close()
    return records, time.perf_counter() - started


def run_closed_loop(
    endpoints: Sequence[Endpoint],
    body: bytes,
    *,
    api_key: str,
    concurrency: int,
    duration_s: float,
    timeout_s: float,
) -> tuple[list[Record], float]:
    """``concurrency`` clients for ``duration_s``, each request to the next of ``endpoints`` in
    turn; returns every request's record and the wall time (the last answers included)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(
            _closed_loop(endpoints, body, api_key, concurrency, duration_s, timeout_s)
        )


def summarize(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    """Latency percentiles over the successful (2xx) requests; errors counted apart."""
    ok = sorted(latency for _, latency, status, _ in records if 200 <= status < 300)
    errors: dict[str, int] = {}
    for _, _, status, _ in records:
        if not 200 <= status < 300:
            key = "transport" if status == TRANSPORT_ERROR else str(status)
            errors[key] = errors.get(key, 0) + 1
    summary: dict[str, Any] = {
        "num_requests": len(records),
        "num_ok": len(ok),
        "num_errors": len(records) - len(ok),
        "errors": errors,
        "wall_s": wall_s,
        "rps": len(ok) / wall_s if wall_s > 0 else 0.0,
        "num_retried": sum(1 for *_, attempts in records if attempts > 1),
    }
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
        summary[f"{name}_ms"] = percentile(ok, q) * 1000 if ok else None
    summary["max_ms"] = ok[-1] * 1000 if ok else None
    return summary


# ---- wrk ----------------------------------------------------------------------------------

# wrk prints this line from the script's done(): latencies in microseconds.
_WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT %d %d %d %d %d %d %d %d %d %d %d %d\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""
_WRK_FIELDS = (
    *("num_requests", "duration_us", "connect", "read", "write", "status", "timeout"),
    *("p50_us", "p90_us", "p99_us", "p999_us", "max_us"),
)
_WRK_LINE = re.compile(r"^WRK_RESULT((?: -?\d+){12})$", re.MULTILINE)


def wrk_script(body: bytes, api_key: str) -> str:
    text = body.decode()
    if "]]" in text:
        raise ValueError("the body cannot go in a Lua long string")
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = [[{text}]]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {api_key}"\n' + _WRK_DONE
    )


def wrk_argv(
    wrk: str,
    script: Path,
    endpoint: Endpoint,
    concurrency: int,
    duration_s: float,
    timeout_s: float,
) -> list[str]:
    # wrk takes whole seconds.
    seconds = max(1, round(duration_s))
    return [
        wrk,
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds}s",
        f"--timeout={max(1, round(timeout_s))}s",
        "-s",
        str(script),
        endpoint.url(CHAT),
    ]


def run_wrk(argv: Sequence[str]) -> dict[str, Any]:
    """Run wrk; returns the same keys as ``summarize`` (errors: wrk's categories)."""
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=600)
    summary = parse_wrk_output(result.stdout) if result.returncode == 0 else None
    if summary is None:
        raise RuntimeError(
            f"wrk failed ({result.returncode}): {' '.join(argv)}\n{result.stdout}{result.stderr}"
        )
    return summary


def parse_wrk_output(stdout: str) -> dict[str, Any] | None:
    """The summary in the line our script's done() prints; None if there is none."""
    match = _WRK_LINE.search(stdout)
    if match is None:
        return None
    values = dict(zip(_WRK_FIELDS, map(int, match.group(1).split()), strict=True))
    error_kinds = ("connect", "read", "write", "status", "timeout")
    errors = {kind: values[kind] for kind in error_kinds if values[kind]}
    # Answers with a status >= 400 are among summary.requests; socket errors are not.
    num_socket_errors = values["connect"] + values["read"] + values["write"]
    num_ok = values["num_requests"] - values["status"]
    wall_s = values["duration_us"] / 1e6
    summary: dict[str, Any] = {
        "num_requests": values["num_requests"] + num_socket_errors,
        "num_ok": num_ok,
        "num_errors": values["status"] + num_socket_errors + values["timeout"],
        "errors": errors,
        "wall_s": wall_s,
        "rps": num_ok / wall_s if wall_s > 0 else 0.0,
        "num_retried": 0,
    }
    for name in ("p50", "p90", "p99", "p999", "max"):
        summary[f"{name}_ms"] = values[f"{name}_us"] / 1000 if num_ok else None
    return summary


def wrk_version(wrk: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        # `wrk --version` prints its banner and usage, and exits 1.
        result = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=10)
        first = (result.stdout or result.stderr).splitlines()
        if first:
            return first[0].split(" Copyright", 1)[0].strip()
    return "unknown"
