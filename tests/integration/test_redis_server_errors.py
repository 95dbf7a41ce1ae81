"""A Redis that answers but refuses — out of memory under ``noeviction``, a read-only replica, a
replica cut off from its primary, a script running too long — on a private real redis-server:
every store raises StorageUnavailableError (503, never a redis-py exception), reads keep working
where Redis serves them, and a Titan on it keeps answering (limits and cache fail open), refuses
what it cannot store with a 503 (never a 500, never a 202), and recovers without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import redis
import redis.asyncio

from tests.integration.harness import running_titan
from tests.integration.test_storage_outage import RedisProcess, private_redis  # noqa: F401
from tests.redis_server import HOST, free_port
from titan.errors import StorageFullError, StorageUnavailableError
from titan.storage.base import Bucket, CacheEntry, Increment, Job
from titan.storage.redis import RedisCounters, RedisDocuments, RedisLimits
from titan.storage.redis_cache import RedisCache
from titan.storage.redis_errors import refused
from titan.storage.redis_jobs import RedisJobQueue

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
async def client(private_redis: RedisProcess) -> AsyncIterator[redis.asyncio.Redis]:  # noqa: F811
    client = redis.asyncio.Redis.from_url(private_redis.url)
    yield client
    await client.aclose()


def admin(server: RedisProcess) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def job(job_id: str) -> Job:
    return Job(id=job_id, tenant="acme", payload={"n": 1}, created_at=time.time())


def entry(key: str) -> CacheEntry:
    return CacheEntry(key, b"answer", time.time(), time.time() + 60, {})


def writes(client: redis.asyncio.Redis) -> dict[str, Callable[[], Awaitable[object]]]:
    """One write through each store, by store."""
    return {
        "documents": lambda: RedisDocuments(client).put("files", "new", {"n": 2}),
        "counters": lambda: RedisCounters(client).increment_many(
            "usage", [Increment("acme", {"tokens": 1})]
        ),
        "limits": lambda: RedisLimits(client).acquire([Bucket("rpm", 10, 1, 1)]),
        "cache": lambda: RedisCache(client).put("exact", entry("new"), max_entries=10),
        "jobs": lambda: RedisJobQueue(client).submit([job("new")]),
    }


async def test_out_of_memory_refuses_writes_as_storage_full_and_reads_keep_working(
    private_redis: RedisProcess,  # noqa: F811
    client: redis.asyncio.Redis,
):
    docs, cache = RedisDocuments(client), RedisCache(client)
    await docs.put("files", "kept", {"n": 1})
    await cache.put("exact", entry("kept"), max_entries=10)
    with admin(private_redis) as server:
        server.config_set("maxmemory-policy", "noeviction")
        server.config_set("maxmemory", 1)  # every write that may grow memory is refused: real OOM
        for write in writes(client).values():
            with pytest.raises(StorageFullError) as full:
                await write()
            assert full.value.status_code == 503 and full.value.code == "storage_full"
            assert "out of memory" in full.value.message and full.value.retry_after
        assert await docs.get("files", "kept") == {"n": 1}
        assert await docs.get("files", "new") is None
        assert await RedisJobQueue(client).get("acme", "new") is None
        assert (await cache.get("exact", "kept")) is not None  # a lookup still hits
        assert await cache.get("exact", "new") is None
        server.config_set("maxmemory", 0)
    for write in writes(client).values():
        await write()
    assert await docs.get("files", "new") == {"n": 2}


async def test_a_read_only_replica_and_a_lost_primary_are_storage_unavailable(
    private_redis: RedisProcess,  # noqa: F811
    client: redis.asyncio.Redis,
):
    docs = RedisDocuments(client)
    await docs.put("files", "kept", {"n": 1})
    with admin(private_redis) as server:
        server.replicaof(HOST, free_port())  # a primary that never answers
        try:
            for write in writes(client).values():
                with pytest.raises(StorageUnavailableError) as refusal:
                    await write()
                assert refusal.value.code == "storage_unavailable", refusal.value.message
                assert "read-only replica" in refusal.value.message
            assert await docs.get("files", "kept") == {"n": 1}  # stale reads still served
            server.config_set("replica-serve-stale-data", "no")  # now reads refuse: MASTERDOWN
            with pytest.raises(StorageUnavailableError) as down:
                await docs.get("files", "kept")
            assert "MASTERDOWN" in down.value.message
        finally:
            server.config_set("replica-serve-stale-data", "yes")
            server.replicaof("NO", "ONE")
    await docs.put("files", "new", {"n": 2})
    assert await docs.get("files", "kept") == {"n": 1}


async def test_a_script_running_too_long_is_storage_unavailable(
    private_redis: RedisProcess,  # noqa: F811
    client: redis.asyncio.Redis,
):
    with admin(private_redis) as server:
        server.config_set("busy-reply-threshold", 50)  # ms before others get BUSY
        looping = redis.Redis.from_url(private_redis.url)
        script = threading.Thread(target=run_forever, args=(looping,), daemon=True)
        script.start()
        try:
            await asyncio.sleep(0.3)
            with pytest.raises(StorageUnavailableError) as busy:
                await RedisDocuments(client).get("files", "any")
            assert "BUSY" in busy.value.message
        finally:
            server.script_kill()
            script.join(timeout=5)
            looping.close()
    assert await RedisDocuments(client).get("files", "any") is None


def run_forever(looping: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # ended by SCRIPT KILL
        looping.eval("while true do end", 0)


def test_other_response_errors_stay_what_they_are():
    assert refused(redis.ResponseError("WRONGTYPE Operation against a key")) is None
    assert refused(redis.exceptions.NoScriptError("No matching script")) is None
    assert isinstance(refused(redis.exceptions.OutOfMemoryError("command not allowed")),
                      StorageFullError)  # fmt: skip
    misconf = refused(redis.ResponseError("MISCONF Redis is configured to save RDB snapshots"))
    assert isinstance(misconf, StorageUnavailableError) and "persist" in misconf.message


def test_a_titan_on_a_redis_out_of_memory_serves_what_fails_open_and_recovers(
    private_redis: RedisProcess,  # noqa: F811
):
    config = {
        "models": [{"name": "sim", "deployments": [{"backend": "simulated"}],
                    "limits": {"rpm": 1000}}],
        "probes": {"enabled": False},
        "storage": private_redis.url,
        "cache": {"exact": True},
        "jobs": {"poll_s": 0.05},
    }  # fmt: skip
    chat = {"model": "sim", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0}  # fmt: skip
    with running_titan(config) as titan, httpx.Client(base_url=titan, timeout=30) as http:
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        with admin(private_redis) as server:
            server.config_set("maxmemory-policy", "noeviction")
            server.config_set("maxmemory", 1)
            other = {**chat, "messages": [{"role": "user", "content": "Another question"}]}
            answered = http.post("/v1/chat/completions", json=other)
            assert answered.status_code == 200, answered.text  # limits, cache, usage fail open
            submitted = http.post("/v1/jobs", json={"endpoint": "/v1/chat/completions",
                                                    "body": chat})  # fmt: skip
            assert submitted.status_code == 503, submitted.text
            error = submitted.json()["error"]
            assert error["code"] == "storage_full" and "out of memory" in error["message"]
            assert int(submitted.headers["retry-after"]) > 0
            server.config_set("maxmemory", 0)
        submitted = http.post("/v1/jobs", json={"endpoint": "/v1/chat/completions", "body": chat})
        assert submitted.status_code == 202, submitted.text
