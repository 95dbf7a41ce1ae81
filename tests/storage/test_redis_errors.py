"""An unreachable Redis surfaces as one Titan error (503 storage_unavailable) from every store,
never as a redis-py exception; the /ready ping is cached."""

from __future__ import annotations

import pytest
import redis.asyncio

from tests.redis_server import HOST, free_port
from titan.errors import StorageUnavailableError
from titan.observability.metrics import TitanMetrics
from titan.service.storage_health import StorageHealth
from titan.storage.base import Bucket, CacheEntry, Increment, Storage
from titan.storage.redis import RedisCounters, RedisDocuments, RedisLimits
from titan.storage.redis_cache import RedisCache
from titan.storage.redis_jobs import RedisJobQueue


async def test_every_redis_store_raises_storage_unavailable_when_nothing_listens():
    # A pool of its own, as open_storage makes: its connections do not retry with backoff.
    pool = redis.asyncio.ConnectionPool(host=HOST, port=free_port(), socket_connect_timeout=1)
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        calls = [
            RedisLimits(client).acquire([Bucket("b", 1, 1, 1)]),
            RedisDocuments(client).get("ns", "id"),
            RedisCounters(client).increment_many("ns", [Increment("c", {"n": 1})]),
            RedisCache(client).get("ns", "key"),
            RedisCache(client).put("ns", CacheEntry("k", b"v", 0, 1, {}), max_entries=1),
            RedisJobQueue(client).counts(),
        ]
        for call in calls:
            with pytest.raises(StorageUnavailableError) as raised:
                await call
            assert raised.value.status_code == 503
            assert raised.value.code == "storage_unavailable"
            assert raised.value.retry_after == 1.0
    finally:
        await client.aclose()
        await pool.disconnect()


async def test_the_ready_ping_is_cached_for_a_second_and_counted_once_per_outage():
    pings = 0
    is_up = False

    async def ping() -> None:
        nonlocal pings
        pings += 1
        if not is_up:
            raise StorageUnavailableError("down")

    clock = [0.0]
    metrics = TitanMetrics()
    storage = Storage("redis://x", None, None, None, ping=ping)  # type: ignore[arg-type]
    health = StorageHealth(storage, metrics, now=lambda: clock[0])
    assert await health.unreachable_reason() == "down"
    assert await health.unreachable_reason() == "down"
    assert pings == 1
    clock[0] = 1.5
    assert await health.unreachable_reason() == "down"
    assert pings == 2
    assert (
        metrics.registry.get_sample_value("titan_storage_errors_total", {"component": "ready"})
        == 1.0
    )
    is_up, clock[0] = True, 3.0
    assert await health.unreachable_reason() is None
    assert health.failing == set()
    assert await StorageHealth(None, metrics).unreachable_reason() is None
