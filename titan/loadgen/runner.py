"""One load run: requests sent by a closed or an open loop until a duration or a count, every
answer timed (client.send), the samples collected.

The open loop never waits for the server: each request is sent at its precomputed time in a task
of its own, so a slow server makes requests pile up in flight, not arrive later. In-flight
requests are capped (``max_in_flight``: each holds a connection, hence a file descriptor); an
arrival that finds the cap reached is not sent and counts as a failed request (status 0, error
``client.NOT_SENT``), which is the honest outcome for an offered load the server cannot absorb.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import resource
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from titan.loadgen.arrivals import Arrivals, ClosedLoop, OpenLoop
from titan.loadgen.client import (
    NOT_SENT,
    ConnectionPool,
    LoadTarget,
    Sample,
    failed,
    send,
)
from titan.loadgen.wire import Endpoint, PreparedRequest, prepare
from titan.loadgen.workloads import Workload

MAX_IN_FLIGHT = 10_000
# File descriptors kept for everything but the load's connections.
RESERVED_DESCRIPTORS = 64

OnSample = Callable[[Sample], None]


@dataclass(frozen=True)
class LoadRun:
    samples: tuple[Sample, ...]  # in the order they finished
    wall_s: float  # from the first send to the last answer
    arrivals: ClosedLoop | OpenLoop
    max_send_lag_s: float = 0.0  # open loop: the latest any send was behind its schedule
    max_in_flight: int = 0  # the most requests that were in flight at once
    num_connections: int = 0  # connections opened


def default_max_in_flight() -> int:
    """MAX_IN_FLIGHT, or fewer where the process may not open that many descriptors."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return MAX_IN_FLIGHT
    return max(1, min(MAX_IN_FLIGHT, soft_limit - RESERVED_DESCRIPTORS))


class _Run:
    """The state of one run: the pool, the samples, what is in flight."""

    def __init__(self, pool: ConnectionPool, timeout_s: float, on_sample: OnSample | None):
        self.pool = pool
        self.timeout_s = timeout_s
        self.on_sample = on_sample
        self.samples: list[Sample] = []
        self.start = time.perf_counter()
        self.num_in_flight = self.max_in_flight = 0
        self.callback_error: BaseException | None = None

    def record(self, sample: Sample) -> None:
        self.samples.append(sample)
        if self.on_sample is not None:
            try:
                self.on_sample(sample)
            except Exception as exc:  # kept for the caller; the load goes on meanwhile
                self.callback_error = self.callback_error or exc

    def launch(self, request: PreparedRequest) -> Coroutine[Any, Any, None]:
        """Counts the request in flight now (not when its coroutine first runs, which may be
        after more arrivals) and returns the coroutine that sends it."""
        self.num_in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.num_in_flight)
        return self._one(request)

    async def _one(self, request: PreparedRequest) -> None:
        try:
            sample = await send(self.pool, request, self.start, self.timeout_s)
        finally:
            self.num_in_flight -= 1
        self.record(sample)


async def _closed_loop(run: _Run, arrivals: ClosedLoop, requests: Any, deadline: float,
                       num_requests: int | None) -> None:  # fmt: skip
    tickets = itertools.count() if num_requests is None else iter(range(num_requests))

    async def client() -> None:
        while time.perf_counter() < deadline and next(tickets, None) is not None:
            await run.launch(next(requests))

    await asyncio.gather(*(client() for _ in range(arrivals.concurrency)))


async def _open_loop(run: _Run, arrivals: OpenLoop, requests: Any, deadline: float,
                     num_requests: int | None, max_in_flight: int) -> float:  # fmt: skip
    """Sends on schedule; returns the largest lag of a send behind its due time."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    offsets = arrivals.offsets()
    if num_requests is not None:
        offsets = itertools.islice(offsets, num_requests)
    max_lag = 0.0
    clock = time.perf_counter
    try:
        for offset in offsets:
            due = run.start + offset
            if due >= deadline:
                break
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            max_lag = max(max_lag, clock() - due)
            request = next(requests)
            if run.num_in_flight >= max_in_flight:
                run.record(failed(due - run.start, 0.0, NOT_SENT))
                continue
            task = loop.create_task(run.launch(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if delay <= 0:  # behind schedule: let the task send before the next arrival
                await asyncio.sleep(0)
        while tasks:
            await asyncio.wait(list(tasks))
    finally:
        for task in tasks:
            task.cancel()
    return max_lag


async def run_load(
    target: LoadTarget,
    arrivals: ClosedLoop | OpenLoop,
    workload: Workload,
    *,
    duration_s: float | None = None,
    num_requests: int | None = None,
    timeout_s: float = 60.0,
    on_sample: OnSample | None = None,
    max_in_flight: int | None = None,
) -> LoadRun:
    """Send ``workload``'s requests to ``target`` as ``arrivals`` says until ``duration_s``
    passed or ``num_requests`` were sent (whichever comes first; at least one of them), then
    wait for the requests in flight (each bounded by ``timeout_s``). ``on_sample`` is called as
    each request finishes, on the loop's thread; an exception it raises is re-raised at the end.
    ``max_in_flight`` caps an open loop's requests in flight (default: 10,000, or what the
    descriptor limit allows)."""
    if duration_s is None and num_requests is None:
        raise ValueError("a load run needs duration_s or num_requests")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be above 0, not {duration_s}")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"num_requests must be at least 1, not {num_requests}")
    if isinstance(arrivals, OpenLoop) and math.isinf(arrivals.rate) and num_requests is None:
        raise ValueError("an infinite rate sends everything at once: it needs num_requests")
    endpoint = Endpoint.of(target.base_url)
    prepared = [prepare(endpoint, body, target.model, target.api_key) for body in workload.bodies]
    requests = itertools.cycle(prepared)
    pool = ConnectionPool(endpoint)
    run = _Run(pool, timeout_s, on_sample)
    deadline = run.start + duration_s if duration_s is not None else math.inf
    max_lag = 0.0
    try:
        if isinstance(arrivals, ClosedLoop):
            await _closed_loop(run, arrivals, requests, deadline, num_requests)
        else:
            cap = max_in_flight if max_in_flight is not None else default_max_in_flight()
            max_lag = await _open_loop(run, arrivals, requests, deadline, num_requests, cap)
        wall_s = time.perf_counter() - run.start
    finally:
        pool.close()
    if run.callback_error is not None:
        raise run.callback_error
    return LoadRun(tuple(run.samples), wall_s, arrivals, max_lag, run.max_in_flight,
                   pool.num_opened)  # fmt: skip


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (a fraction of asyncio's cost per request)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_load_sync(
    target: LoadTarget, arrivals: Arrivals, workload: Workload, **options: Any
) -> LoadRun:
    """``run_load`` on a fresh event loop (uvloop where installed), for synchronous callers."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(run_load(target, arrivals, workload, **options))
