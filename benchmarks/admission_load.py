"""The admission benchmark's moving parts: an upstream of fixed capacity, an open-loop load
generator, per-point summaries and a Redis database of its own for the replicas phase.

The upstream answers each request after a fixed latency, ``slots`` requests at once; more wait in
an unbounded FIFO queue, as in an inference server whose batch is full, so its latency grows with
the load (the simulated backend has no such limit: it serves any number at once). A request
whose client leaves while it waits leaves the queue (the kindest a backend can be). Run it with
``python -m benchmarks.admission_load --port P --latency-s L --slots C``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from benchmarks.gateway_load import CHAT, CHAT_PATH
from titan.loadgen.client import ConnectionPool
from titan.loadgen.metrics import percentile
from titan.loadgen.runner import new_event_loop
from titan.loadgen.wire import Endpoint

TRANSPORT_ERROR = 0  # a status in place of none: reset, refused, cut short
TIMED_OUT = -1  # the client gave up at its timeout (= the request's deadline)
# Refusals that admission answers at once; "queue_timeout" is a drop after a wait.
IMMEDIATE_REFUSALS = frozenset({"queue_full", "deadline_unreachable", "rate_limit_exceeded"})


# ---- the upstream ------------------------------------------------------------------------


async def _send_json(send: Any, payload: Any, status: int = 200) -> None:
    import orjson

    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(payload)})


async def _disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(*aws: Any) -> int:
    """Run ``aws`` until one is done, cancel the rest; returns the index of the first done."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return next(i for i, task in enumerate(tasks) if task in done)


class FixedLatency:
    """ASGI app: a chat answer (16 words) ``latency_s`` after the request, unless the client
    leaves first; GET /health for readiness."""

    def __init__(self, latency_s: float, model: str):
        message = {"role": "assistant", "content": " ".join(["word"] * 16)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}
        self.latency_s, self.answer = latency_s, {
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": model,
            "choices": [choice], "usage": usage,
        }  # fmt: skip

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] != CHAT_PATH:
            is_health = scope["path"] == "/health"
            return await _send_json(send, {"status": "ok"}, 200 if is_health else 404)
        await receive()  # the body
        if await _first(asyncio.sleep(self.latency_s), _disconnect(receive)) == 0:
            await _send_json(send, self.answer)  # else the client left


class FifoSlots:
    """ASGI middleware: at most ``slots`` chat requests reach ``app`` at once, the rest wait in
    arrival order. ``GET /fifo`` tells its counters (and restarts the peak of the queue)."""

    def __init__(self, app: Any, slots: int):
        self.app = app
        self.slots = asyncio.Semaphore(slots)  # FIFO: waiters are woken in arrival order
        self.counts = {"running": 0, "waiting": 0, "peak_waiting": 0, "served": 0, "left": 0}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in (CHAT_PATH, "/fifo"):
            return await self.app(scope, receive, send)
        if scope["path"] == "/fifo":
            counts = dict(self.counts)
            self.counts["peak_waiting"] = self.counts["waiting"]
            return await _send_json(send, counts)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if not await self._acquire(receive):
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        counts = self.counts
        counts["running"] += 1
        try:
            await self.app(scope, replay, send)
        finally:
            counts["running"] -= 1
            counts["served"] += 1
            self.slots.release()

    async def _acquire(self, receive: Any) -> bool:
        """Wait for a slot; False if the client left first (the request leaves the queue)."""
        counts = self.counts
        counts["waiting"] += 1
        counts["peak_waiting"] = max(counts["peak_waiting"], counts["waiting"])
        acquiring = asyncio.ensure_future(self.slots.acquire())
        try:
            await _first(asyncio.shield(acquiring), _disconnect(receive))
        finally:
            counts["waiting"] -= 1
        if acquiring.done() and not acquiring.cancelled():
            return True
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquiring
        if not acquiring.cancelled():  # granted in the same instant: give it back
            self.slots.release()
        counts["left"] += 1
        return False


def serve_upstream(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="An upstream of fixed capacity.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-s", type=float, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--model", default="sim")
    args = parser.parse_args(argv)

    import uvicorn

    app = FifoSlots(FixedLatency(args.latency_s, args.model), args.slots)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
        lifespan="off", timeout_graceful_shutdown=1,
    )  # fmt: skip
    uvicorn.Server(config).run()


# ---- the open-loop client ----------------------------------------------------------------


def error_code(body: bytes) -> str | None:
    import orjson

    try:
        error = orjson.loads(body).get("error") or {}
        return error.get("code") or error.get("type")
    except (orjson.JSONDecodeError, AttributeError):
        return None


# One request: sent (s from the load's start), latency (s), status (or TRANSPORT_ERROR,
# TIMED_OUT), the error code of a refusal, and how late the generator sent it (s).
Record = tuple[float, float, int, str | None, float]


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    rng, times, at = random.Random(seed), [], 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration_s:
            return times
        times.append(at)


async def _open_loop(
    request: bytes, endpoint: Endpoint, arrivals: Sequence[float], timeout_s: float
) -> list[Record]:
    records: list[Record] = []
    pool = ConnectionPool(endpoint)  # unbounded: an open loop opens what its arrivals need

    async def one(scheduled: float, start: float) -> None:
        sent, code = time.perf_counter(), None
        try:
            async with asyncio.timeout(timeout_s):  # leaving closes the connection
                answer = await pool.fetch(request, is_stream=False)
            status = answer.status
            if status >= 300:
                code = error_code(answer.body)
        except TimeoutError:
            status = TIMED_OUT
        except (OSError, EOFError, ValueError):
            status = TRANSPORT_ERROR
        latency = time.perf_counter() - sent
        records.append((sent - start, latency, status, code, sent - start - scheduled))

    start = time.perf_counter()  # uvloop's loop.time() counts whole milliseconds
    tasks = []
    try:
        for scheduled in arrivals:
            delay = start + scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(scheduled, start)))
        await asyncio.gather(*tasks)
    finally:
        pool.close()
    return records


def run_open_loop(
    base_url: str,
    body: bytes,
    headers: dict[str, str],
    arrivals: Sequence[float],
    timeout_s: float,
) -> list[Record]:
    """POST ``body`` (a chat completion) at each of ``arrivals`` (s from now) whatever the
    answers: an open loop."""
    endpoint = Endpoint.of(base_url)
    request = endpoint.request("POST", CHAT, None, body, headers)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(_open_loop(request, endpoint, arrivals, timeout_s))


def _ms(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q) * 1000 if values else None


def summarize_point(records: Sequence[Record], duration_s: float) -> dict[str, Any]:
    """Goodput: successes (2xx within the client's timeout, which is the deadline) that completed
    within the ``duration_s`` of arrivals, per second (what is still queued at its end is not
    counted: a queue's backlog cannot inflate it). Refused: answered at once (503 queue_full or
    deadline_unreachable, 429); dropped: 503 queue_timeout after a wait; late: no answer by the
    deadline; errors: anything else."""
    ok, refused, outcome = [], [], {"dropped": 0, "late": 0, "errors": 0, "in_window": 0}
    reasons: dict[str, int] = {}
    for sent, latency, status, code, _ in records:
        if 200 <= status < 300:
            ok.append(latency)
            outcome["in_window"] += sent + latency <= duration_s
        elif status == TIMED_OUT:
            outcome["late"] += 1
        elif status in (429, 503) and code in IMMEDIATE_REFUSALS:
            refused.append(latency)
        elif status == 503 and code == "queue_timeout":
            outcome["dropped"] += 1
        else:
            outcome["errors"] += 1
        if not 200 <= status < 300:
            key = {TIMED_OUT: "timeout", TRANSPORT_ERROR: "transport"}.get(status)
            key = key or f"{status} {code or ''}".strip()
            reasons[key] = reasons.get(key, 0) + 1
    return {
        "num_requests": len(records), "offered_rps": len(records) / duration_s,
        "num_ok": len(ok), "num_ok_in_window": outcome["in_window"],
        "goodput_rps": outcome["in_window"] / duration_s, "p50_ms": _ms(ok, 50),
        "p99_ms": _ms(ok, 99), "num_refused": len(refused), "refusal_p50_ms": _ms(refused, 50),
        "refusal_p99_ms": _ms(refused, 99), "refusal_latencies_ms": [x * 1000 for x in refused],
        "num_dropped": outcome["dropped"], "num_late": outcome["late"],
        "num_errors": outcome["errors"], "outcomes": reasons,
        "send_lag_p99_ms": _ms([lag for *_, lag in records], 99),
    }  # fmt: skip


# ---- a Redis database of the run's own ---------------------------------------------------

CLAIM_KEY = "titan-bench:admission:claim"
CLAIM_TTL_S = 1800


def claim_redis_db(url: str) -> str:
    """``url`` (redis://host:port[/db]) with an empty database claimed for this run: the one it
    names, else the highest empty one of 15..1. Titan's keys have a fixed prefix, so a database
    of its own keeps the run's limit buckets apart from everything else."""
    import secrets

    import redis

    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    named = parts.path.strip("/")
    candidates = [int(named)] if named else list(range(15, 0, -1))
    for db in candidates:
        client = redis.Redis.from_url(f"{base}/{db}", socket_connect_timeout=5)
        with contextlib.closing(client):
            is_empty = client.dbsize() == 0
            if is_empty and client.set(CLAIM_KEY, secrets.token_hex(8), nx=True, ex=CLAIM_TTL_S):
                return f"{base}/{db}"
    which = f"database {named} is" if named else "databases 15..1 are all"
    raise RuntimeError(f"Redis at {base}: {which} in use; name an empty one (redis://…/N)")


def release_redis_db(url: str) -> int:
    """Delete the run's keys (Titan's, and the claim); returns how many."""
    import redis

    with contextlib.closing(redis.Redis.from_url(url, socket_connect_timeout=5)) as client:
        return client.delete(*client.scan_iter(match="titan:*", count=1000), CLAIM_KEY)


def admitted_by_replica(base_url: str, model: str) -> int:
    """Sum of titan_admission_admitted_total for ``model`` in the replica's /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    prefix, label = "titan_admission_admitted_total{", f'model="{model}"'
    admitted = [float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(prefix) and label in x]
    return int(sum(admitted))


# ---- the replicas phase ------------------------------------------------------------------


def start_titan(services: Any, workspace: Any, name: str, config: dict[str, Any], env):
    """``titan serve --config`` with ``env``; our other TITAN_* variables are kept from it."""
    from titan.chaos import processes

    unset = [key for key in os.environ if key.startswith("TITAN_") and key not in env]
    path = workspace.write_yaml(f"{name}.titan.yaml", config)
    return services.start(
        name, processes.titan_argv("serve", "--config", str(path)),
        f"http://127.0.0.1:{config['server']['port']}", workspace.log_dir, ready_path="/ready",
        timeout_s=60.0, env=env, unset_env=unset, env_shown=env,
    )  # fmt: skip


def replicas_config(port: int, storage: str, model: str, rpm: int) -> dict[str, Any]:
    deployment = {"backend": "simulated", "profile": {"ttft_s": 0.001}}
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "models": [{"name": model, "limits": {"rpm": rpm}, "deployments": [deployment]}],
        "hedge": {"enabled": False}, "probes": {"enabled": False}, "storage": storage,
    }  # fmt: skip


def run_replicas(settings: Any, workspace: Any, progress: Any) -> dict[str, Any]:
    """Two replicas, one Redis, one model limit; the admitted count against the bucket's."""
    from benchmarks import gateway_load
    from titan.chaos.processes import Services, free_port

    progress("replicas: claiming a Redis database")
    storage = claim_redis_db(settings.redis_url)
    model = f"admbench-{uuid.uuid4().hex[:8]}"  # a fresh model: fresh buckets
    try:
        with Services() as services:
            replicas, config = [], {}
            for index in range(2):
                config = replicas_config(free_port(), storage, model, settings.rpm)
                replicas.append(start_titan(services, workspace, f"replica-{index + 1}",
                                            config, {"TITAN_STORAGE": storage}))  # fmt: skip
            progress(f"replicas: {settings.concurrency} connections for {settings.window_s:g} s")
            records, _ = gateway_load.run_closed_loop(
                [Endpoint.of(r.base_url) for r in replicas],
                gateway_load.chat_body(model, is_stream=False, max_tokens=4),
                api_key="unused", concurrency=settings.concurrency,
                duration_s=settings.window_s, timeout_s=10.0,
            )  # fmt: skip
            by_replica = [admitted_by_replica(r.base_url, model) for r in replicas]
    finally:
        num_deleted = release_redis_db(storage)
    sent = [record[0] for record in records]
    elapsed = max(sent) - min(sent) if sent else 0.0
    admitted = sum(1 for record in records if record[2] == 200)
    expected = settings.rpm + settings.rpm / 60 * elapsed
    return {
        "storage": storage, "model": model, "rpm": settings.rpm, "num_requests": len(records),
        "elapsed_s": elapsed, "num_admitted": admitted, "admitted_by_replica": by_replica,
        "num_refused": sum(1 for record in records if record[2] == 429),
        "num_errors": sum(1 for record in records if record[2] not in (200, 429)),
        "expected": expected, "error_pct": (admitted - expected) / expected * 100,
        "rps": len(records) / elapsed if elapsed else 0.0, "num_keys_deleted": num_deleted,
        "commands": [r.command for r in replicas], "config": config,
    }  # fmt: skip


if __name__ == "__main__":
    serve_upstream()
