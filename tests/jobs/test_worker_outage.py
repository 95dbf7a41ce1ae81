"""A worker whose queue's store goes down and comes back: one warning per outage and per kind of
call (claims, lease renewals, settlements), one "works again" line, claims backing off meanwhile,
and the worker still running — the jobs submitted during the outage run once the store is back."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from titan.errors import StorageUnavailableError
from titan.jobs.worker import JobWorker, RetryPolicy
from titan.storage.base import Job
from titan.storage.outage_log import OutageLog
from titan.storage.sqlite import IN_MEMORY, SqliteDatabase
from titan.storage.sqlite_jobs import SqliteJobQueue

POLL_S = 0.01


class FlakyQueue:
    """A real (in-memory SQLite) queue whose calls fail while ``is_down``, as a store in an
    outage does; counts the claims tried."""

    def __init__(self, queue: SqliteJobQueue) -> None:
        self.queue = queue
        self.is_down = False
        self.num_claims = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.queue, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if name == "claim":
                self.num_claims += 1
            if self.is_down:
                raise StorageUnavailableError("The storage (Redis) is unreachable: refused.")
            return await method(*args, **kwargs)

        return call


@pytest.fixture
async def queue() -> AsyncIterator[FlakyQueue]:
    db = await SqliteDatabase.open(IN_MEMORY)
    yield FlakyQueue(await SqliteJobQueue.open(db))
    await db.close()


def job(n: int) -> Job:
    return Job(id=f"job-{n}", tenant="t", payload={"n": n})


async def finished(queue: FlakyQueue, job_id: str, timeout_s: float = 10) -> Job:
    for _ in range(int(timeout_s / 0.01)):
        found = await queue.queue.get("t", job_id)
        if found is not None and found.is_final:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"{job_id} did not finish")


def lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


async def test_an_outage_logs_once_backs_off_and_the_worker_keeps_running(queue, caplog):
    caplog.set_level(logging.INFO, logger="titan.jobs.worker")
    release = asyncio.Event()

    async def execute(job: Job) -> dict:
        if job.payload["n"] == 1:
            await release.wait()  # running through the outage: its lease renewals fail
        return {"answer": job.payload["n"]}

    worker = JobWorker(queue, execute, name="w", concurrency=4, lease_s=0.3, poll_s=POLL_S,
                       retry=RetryPolicy(0.01, 0.05), rng=random.Random(0))  # fmt: skip
    await queue.queue.submit([job(1)])
    worker.start()
    try:
        while "job-1" not in worker.runs:
            await asyncio.sleep(0.01)
        queue.is_down = True
        claims_before = queue.num_claims
        await asyncio.sleep(1.0)  # 100 polls' worth, and ~10 lease rounds
        release.set()  # job 1 ends during the outage: storing its result fails
        await asyncio.sleep(0.3)
        num_claims_down = queue.num_claims - claims_before

        assert len(lines(caplog, logging.WARNING, "claiming jobs failed")) == 1
        assert len(lines(caplog, logging.WARNING, "renewing leases failed")) == 1
        assert len(lines(caplog, logging.WARNING, "storing job outcomes failed")) == 1
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not [r for r in caplog.records if r.exc_info]  # a Titan error: no traceback
        # Backing off (0.02, 0.04, ... 5 s): a handful of claims in 1.3 s, not one per poll.
        assert 3 <= num_claims_down <= 10, num_claims_down

        queue.is_down = False
        await queue.queue.submit([job(2)])
        worker.wake()
        assert (await finished(queue, "job-2")).result == {"answer": 2}
        # Job 1's outcome was lost with the outage: its lease ran out and it runs again.
        assert (await finished(queue, "job-1")).result == {"answer": 1}
        assert len(lines(caplog, logging.INFO, "claiming jobs works again")) == 1
        assert len(lines(caplog, logging.INFO, "storing job outcomes works again")) == 1
        assert all(loop.done() is False for loop in worker._loops)  # still running
    finally:
        release.set()
        await worker.stop()


async def test_a_second_outage_is_logged_again(caplog):
    caplog.set_level(logging.INFO, logger="titan.jobs.worker")
    log = OutageLog("polling", logging.getLogger("titan.jobs.worker"))
    for _ in range(2):
        for _ in range(5):
            log.failed(StorageUnavailableError("down"))
        log.succeeded()
        log.succeeded()
    assert len(lines(caplog, logging.WARNING, "polling failed")) == 2
    assert len(lines(caplog, logging.INFO, "polling works again")) == 2


def test_backoff_doubles_from_the_poll_interval_up_to_a_cap():
    log = OutageLog("polling", logging.getLogger("titan.jobs.worker"))
    assert log.backoff_s(0.5, max_s=8.0) == 0.5
    delays = []
    for _ in range(6):
        log.failed(StorageUnavailableError("down"))
        delays.append(log.backoff_s(0.5, max_s=8.0))
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    log.succeeded()
    assert log.backoff_s(0.5, max_s=8.0) == 0.5
