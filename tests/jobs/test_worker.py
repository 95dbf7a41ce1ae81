"""The job worker against a real (in-memory SQLite) queue and a scripted ``execute``: results,
retries with backoff, dead letters, permanent failures, cancellation, lost leases, hand-off on
stop, and holding back while interactive traffic waits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from titan.errors import InvalidRequestError, ServiceUnavailableError
from titan.jobs.worker import JobWorker, RetryPolicy
from titan.storage.base import Job
from titan.storage.sqlite import IN_MEMORY, SqliteDatabase
from titan.storage.sqlite_jobs import SqliteJobQueue


@pytest.fixture
async def queue() -> AsyncIterator[SqliteJobQueue]:
    db = await SqliteDatabase.open(IN_MEMORY)
    yield await SqliteJobQueue.open(db)
    await db.close()


def job(n: int, **fields) -> Job:
    return Job(id=f"job-{n}", tenant="t", payload={"n": n}, **fields)


async def settled(queue: SqliteJobQueue, job_id: str, timeout_s: float = 5) -> Job:
    for _ in range(int(timeout_s / 0.01)):
        found = await queue.get("t", job_id)
        if found is not None and found.is_final:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"{job_id} did not finish: {found}")


def worker(queue, execute, **options) -> JobWorker:
    options = {"name": "w", "concurrency": 4, "lease_s": 5.0, "poll_s": 0.01,
               "retry": RetryPolicy(0.01, 0.05), "rng": random.Random(0), **options}  # fmt: skip
    return JobWorker(queue, execute, **options)


async def test_results_retries_dead_letters_and_permanent_failures(queue):
    calls: dict[int, int] = {}
    finished: list[str] = []

    async def execute(job: Job) -> dict:
        n = job.payload["n"]
        calls[n] = calls.get(n, 0) + 1
        if n == 2 and calls[n] < 3:
            raise ServiceUnavailableError("upstream down")  # retryable: third time lucky
        if n == 3:
            raise ServiceUnavailableError("always down")
        if n == 4:
            raise InvalidRequestError("bad request")  # retrying cannot fix it
        return {"answer": n}

    async def on_finished(finished_job: Job) -> None:
        finished.append(finished_job.id)

    running = worker(queue, execute, on_finished=on_finished)
    await queue.submit([job(1), job(2, max_attempts=3), job(3, max_attempts=2), job(4)])
    running.start()
    try:
        ok, retried, dead, failed = [await settled(queue, f"job-{n}") for n in (1, 2, 3, 4)]
    finally:
        await running.stop()
    assert (ok.state, ok.result, ok.attempts) == ("succeeded", {"answer": 1}, 1)
    assert (retried.state, retried.result, retried.attempts) == ("succeeded", {"answer": 2}, 3)
    assert (dead.state, dead.attempts, calls[3]) == ("dead_letter", 2, 2)
    assert dead.error["status"] == 503 and "always down" in dead.error["message"]
    assert (failed.state, failed.attempts, failed.error["status"]) == ("failed", 1, 400)
    assert sorted(finished) == ["job-1", "job-2", "job-3", "job-4"]


def test_backoff_grows_with_jitter_and_a_cap():
    policy, rng = RetryPolicy(base_s=1.0, max_s=10.0), random.Random(1)
    delays = [policy.delay_s(attempt, rng) for attempt in (1, 2, 3, 8)]
    assert 0.5 <= delays[0] <= 1.5 and 1 <= delays[1] <= 3 and 2 <= delays[2] <= 6
    assert 5 <= delays[3] <= 15  # capped at 10 before the jitter


async def test_cancel_stops_the_running_task_and_settles_cancelled(queue):
    started, stopped = asyncio.Event(), asyncio.Event()

    async def execute(job: Job) -> dict:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return {}

    running = worker(queue, execute)
    await queue.submit([job(1)])
    running.start()
    try:
        await asyncio.wait_for(started.wait(), 5)
        await queue.cancel("t", "job-1", now=0)  # asked elsewhere: the lease renewal tells it
        done = await settled(queue, "job-1")
    finally:
        await running.stop()
    assert stopped.is_set() and done.state == "cancelled"


async def test_a_lost_lease_stops_the_work_and_stores_nothing(queue):
    started = asyncio.Event()

    async def execute(job: Job) -> dict:
        started.set()
        await asyncio.sleep(60)
        return {"late": True}

    running = worker(queue, execute, lease_s=0.3, now=lambda: 1000.0)
    await queue.submit([job(1)])
    running.start()
    try:
        await asyncio.wait_for(started.wait(), 5)
        # Later, another worker finds the lease run out (as if this one had stalled) and
        # takes the job over.
        assert len(await queue.claim("other", limit=1, lease_s=60, now=2000)) == 1
        for _ in range(300):
            if not running.runs:
                break
            await asyncio.sleep(0.01)
        assert not running.runs  # it gave up the job
        assert await queue.settle("job-1", "other", state="succeeded", now=2001, result={"x": 1})
    finally:
        await running.stop()
    assert (await queue.get("t", "job-1")).result == {"x": 1}  # type: ignore[union-attr]


async def test_stop_hands_running_jobs_back_to_the_queue(queue):
    started = asyncio.Event()

    async def execute(job: Job) -> dict:
        started.set()
        await asyncio.sleep(60)
        return {}

    running = worker(queue, execute)
    await queue.submit([job(1)])
    running.start()
    await asyncio.wait_for(started.wait(), 5)
    await running.stop()
    back = await queue.get("t", "job-1")
    assert back is not None and back.state == "queued" and back.worker is None


async def test_no_job_starts_while_interactive_traffic_waits(queue):
    waiting = [True]
    ran: list[int] = []

    async def execute(job: Job) -> dict:
        ran.append(job.payload["n"])
        return {}

    running = worker(queue, execute, may_start=lambda: not waiting[0])
    await queue.submit([job(1)])
    running.start()
    try:
        await asyncio.sleep(0.1)
        assert ran == []
        waiting[0] = False
        assert (await settled(queue, "job-1")).state == "succeeded"
    finally:
        await running.stop()


async def test_capacity_refusals_wait_without_spending_attempts_and_spent_budgets_fail(queue):
    from titan.errors import QuotaExceededError, RateLimitError

    calls = {5: 0, 6: 0}

    async def execute(job: Job) -> dict:
        n = job.payload["n"]
        calls[n] += 1
        if n == 6:
            raise QuotaExceededError("budget spent")
        if calls[n] < 4:
            raise RateLimitError("slow down", retry_after=0.01)
        return {"ok": True}

    running = worker(queue, execute)
    await queue.submit([job(5, max_attempts=1), job(6, max_attempts=3)])
    running.start()
    try:
        waited, spent = await settled(queue, "job-5"), await settled(queue, "job-6")
    finally:
        await running.stop()
    assert (waited.state, waited.attempts, calls[5]) == ("succeeded", 1, 4)
    assert (spent.state, calls[6]) == ("failed", 1)
