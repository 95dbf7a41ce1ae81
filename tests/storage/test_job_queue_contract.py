"""``JobQueue``: the same contract in every store — priorities, leases, retries, dead letters,
cancellation, idempotency, tenancy, pages, counts and expiry — and no job claimed twice by
concurrent workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from titan.storage.base import Job, JobQueue
from titan.storage.sqlite import IN_MEMORY, SqliteDatabase
from titan.storage.sqlite_jobs import SqliteJobQueue

LEASE = 10.0


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def queue(request, tmp_path) -> AsyncIterator[JobQueue]:
    if request.param == "redis":
        import redis.asyncio

        from titan.storage.redis_jobs import RedisJobQueue

        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        client = redis.asyncio.Redis.from_url(url)
        yield RedisJobQueue(client, prefix=prefix)
        await client.aclose()
        return
    path = IN_MEMORY if request.param == "memory" else tmp_path / "titan.db"
    db = await SqliteDatabase.open(path)
    yield await SqliteJobQueue.open(db)
    await db.close()


def job(n: int, tenant: str = "t", **fields) -> Job:
    return Job(id=f"job-{n:04d}", tenant=tenant, payload={"n": n}, created_at=float(n),
               run_at=float(n), **fields)  # fmt: skip


async def test_claims_go_by_priority_then_age_and_lease_each_job_once(queue: JobQueue):
    await queue.submit([job(1, priority=5), job(2, priority=0), job(3, priority=5), job(4)])
    first = await queue.claim("w1", limit=2, lease_s=LEASE, now=100)
    assert [j.id for j in first] == ["job-0002", "job-0004"]
    assert all(j.state == "running" and j.worker == "w1" and j.attempts == 1 for j in first)
    assert first[0].lease_until == 100 + LEASE and first[0].started_at == 100
    rest = await queue.claim("w2", limit=10, lease_s=LEASE, now=101)
    assert [j.id for j in rest] == ["job-0001", "job-0003"]
    assert await queue.claim("w3", limit=10, lease_s=LEASE, now=102) == []


async def test_a_job_is_not_due_before_run_at(queue: JobQueue):
    await queue.submit([Job(id="later", tenant="t", payload={}, run_at=50.0)])
    assert await queue.claim("w", limit=1, lease_s=LEASE, now=49) == []
    assert [j.id for j in await queue.claim("w", limit=1, lease_s=LEASE, now=50)] == ["later"]


async def test_only_the_lease_holder_settles_and_the_result_is_stored_once(queue: JobQueue):
    await queue.submit([job(1, result_ttl_s=60.0)])
    (claimed,) = await queue.claim("w1", limit=1, lease_s=LEASE, now=100)
    assert not await queue.settle(claimed.id, "w2", state="succeeded", now=101, result={"x": 2})
    assert await queue.settle(claimed.id, "w1", state="succeeded", now=102, result={"x": 1})
    assert not await queue.settle(claimed.id, "w1", state="succeeded", now=103, result={"x": 3})
    done = await queue.get("t", claimed.id)
    assert done is not None and done.state == "succeeded" and done.result == {"x": 1}
    assert done.finished_at == 102 and done.expires_at == 162 and done.worker is None


async def test_a_dead_workers_job_is_claimed_again_after_its_lease(queue: JobQueue):
    await queue.submit([job(1)])
    (first,) = await queue.claim("dead", limit=1, lease_s=LEASE, now=100)
    assert await queue.renew(first.id, "dead", lease_s=LEASE, now=105) is not None  # to 115
    assert await queue.claim("w2", limit=1, lease_s=LEASE, now=114) == []
    (again,) = await queue.claim("w2", limit=1, lease_s=LEASE, now=116)
    assert again.id == first.id and again.worker == "w2" and again.attempts == 2
    assert await queue.renew(first.id, "dead", lease_s=LEASE, now=117) is None  # lost it
    assert not await queue.settle(first.id, "dead", state="succeeded", now=118, result={})
    assert await queue.settle(first.id, "w2", state="succeeded", now=119, result={"ok": 1})


async def test_retries_wait_for_run_at_and_exhausted_leases_go_to_dead_letter(queue: JobQueue):
    await queue.submit([job(1, max_attempts=2)])
    (first,) = await queue.claim("w", limit=1, lease_s=LEASE, now=100)
    error = {"code": "upstream_error", "message": "503"}
    assert await queue.settle(first.id, "w", state="queued", now=101, error=error, run_at=130)
    retried = await queue.get("t", first.id)
    assert retried is not None and retried.state == "queued" and retried.error == error
    assert await queue.claim("w", limit=1, lease_s=LEASE, now=120) == []
    (second,) = await queue.claim("w", limit=1, lease_s=LEASE, now=130)
    assert second.attempts == 2
    # Its worker dies too: no attempt left, so the next claim dead-letters it.
    assert await queue.claim("w", limit=1, lease_s=LEASE, now=200) == []
    dead = await queue.get("t", first.id)
    assert dead is not None and dead.state == "dead_letter" and dead.error == error


async def test_cancel_a_queued_job_at_once_and_a_running_one_through_its_worker(
    queue: JobQueue,
):
    await queue.submit([job(1), job(2)])
    queued = await queue.cancel("t", "job-0002", now=100)
    assert queued is not None and queued.state == "cancelled" and queued.finished_at == 100
    (running,) = await queue.claim("w", limit=5, lease_s=LEASE, now=100)
    assert running.id == "job-0001"
    marked = await queue.cancel("t", running.id, now=101)
    assert marked is not None and marked.state == "running" and marked.is_cancel_requested
    renewed = await queue.renew(running.id, "w", lease_s=LEASE, now=102)
    assert renewed is not None and renewed.is_cancel_requested  # the worker learns of it
    assert await queue.settle(running.id, "w", state="cancelled", now=103)
    assert await queue.cancel("other-tenant", running.id, now=104) is None
    final = await queue.cancel("t", running.id, now=104)  # cancelling a final job changes nothing
    assert final is not None and final.state == "cancelled" and final.finished_at == 103


async def test_a_cancelled_job_whose_worker_died_ends_cancelled(queue: JobQueue):
    await queue.submit([job(1)])
    (running,) = await queue.claim("dead", limit=1, lease_s=LEASE, now=100)
    await queue.cancel("t", running.id, now=101)
    assert await queue.claim("w", limit=1, lease_s=LEASE, now=200) == []
    assert (await queue.get("t", running.id)).state == "cancelled"  # type: ignore[union-attr]


async def test_a_job_past_its_deadline_expires_instead_of_running(queue: JobQueue):
    await queue.submit([job(1, deadline=150.0), job(2)])
    assert [j.id for j in await queue.claim("w", limit=5, lease_s=LEASE, now=151)] == ["job-0002"]
    expired = await queue.get("t", "job-0001")
    assert expired is not None and expired.state == "expired"
    assert expired.error is not None and expired.error["code"] == "expired"


async def test_idempotency_keys_return_the_first_job_per_tenant(queue: JobQueue):
    first = await queue.submit([job(1, idempotency_key="k")])
    again = await queue.submit([job(2, idempotency_key="k"), job(3, idempotency_key="k2")])
    assert [j.id for j in again] == ["job-0001", "job-0003"] and first[0].id == "job-0001"
    other = await queue.submit([job(4, tenant="u", idempotency_key="k")])
    assert other[0].id == "job-0004"  # another tenant's key is another key


async def test_tenants_pages_filters_and_counts(queue: JobQueue):
    await queue.submit([job(n, batch_id="b" if n % 2 else None) for n in range(1, 8)])
    await queue.submit([job(100, tenant="u")])
    assert await queue.get("u", "job-0001") is None
    page = await queue.list("t", limit=3)
    assert [j.id for j in page] == ["job-0007", "job-0006", "job-0005"]
    page = await queue.list("t", limit=3, after="job-0005")
    assert [j.id for j in page] == ["job-0004", "job-0003", "job-0002"]
    assert [j.id for j in await queue.list("t", batch_id="b")] == [
        "job-0007", "job-0005", "job-0003", "job-0001"]  # fmt: skip
    await queue.claim("w", limit=2, lease_s=LEASE, now=100)
    running = await queue.list("t", state="running")
    assert {j.id for j in running} == {"job-0001", "job-0002"}
    assert await queue.counts("t") == {"queued": 5, "running": 2}
    assert await queue.counts() == {"queued": 6, "running": 2}
    assert await queue.counts("t", batch_id="b") == {"queued": 3, "running": 1}


async def test_finished_jobs_are_purged_after_their_ttl(queue: JobQueue):
    await queue.submit([job(1, result_ttl_s=10.0), job(2)])
    claimed = await queue.claim("w", limit=2, lease_s=LEASE, now=100)
    for item in claimed:
        await queue.settle(item.id, "w", state="succeeded", now=100, result={})
    assert await queue.purge(109) == 0
    assert await queue.purge(111) == 1
    assert await queue.get("t", "job-0001") is None
    assert await queue.get("t", "job-0002") is not None  # no TTL: kept


async def test_concurrent_workers_never_claim_one_job_twice(queue: JobQueue):
    await queue.submit([job(n) for n in range(200)])

    async def drain(worker: str) -> list[str]:
        ids = []
        while claimed := await queue.claim(worker, limit=7, lease_s=LEASE, now=1000):
            ids += [j.id for j in claimed]
        return ids

    drained = await asyncio.gather(*(drain(f"w{i}") for i in range(4)))
    every = [job_id for ids in drained for job_id in ids]
    assert len(every) == len(set(every)) == 200


async def test_a_claim_leases_no_more_jobs_than_it_returns(queue: JobQueue):
    await queue.submit([job(1), job(2), job(3)])
    await queue.claim("dead", limit=2, lease_s=LEASE, now=100)  # leases run out at 110
    (only,) = await queue.claim("w", limit=1, lease_s=LEASE, now=200)
    others = await queue.claim("w2", limit=5, lease_s=LEASE, now=201)
    assert {only.id, *(j.id for j in others)} == {"job-0001", "job-0002", "job-0003"}


async def test_a_requeue_may_give_its_attempt_back(queue: JobQueue):
    await queue.submit([job(1, max_attempts=1)])
    (first,) = await queue.claim("w", limit=1, lease_s=LEASE, now=100)
    assert await queue.settle(first.id, "w", state="queued", now=101, counts_attempt=False)
    (again,) = await queue.claim("w", limit=1, lease_s=LEASE, now=102)
    assert again.attempts == 1  # not dead-lettered: the refused attempt did not count
