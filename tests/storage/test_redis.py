"""Redis stores on a real Redis: lease expiry by TTL, atomicity across two clients (two
replicas), documents and counters. Bucket semantics shared with memory: test_limits_contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from titan.errors import ServiceUnavailableError
from titan.storage import open_storage
from titan.storage.base import Bucket, ConcurrencySlot
from titan.storage.redis import RedisCounters, RedisDocuments, RedisLimits

pytestmark = pytest.mark.redis


@pytest.fixture
async def clients(redis_url) -> AsyncIterator[tuple[redis.asyncio.Redis, redis.asyncio.Redis]]:
    first, second = redis.asyncio.Redis.from_url(redis_url), redis.asyncio.Redis.from_url(redis_url)
    yield first, second
    await first.aclose()
    await second.aclose()


async def test_bucket_of_50_admits_exactly_50_of_200_from_two_replicas(clients, redis_prefix):
    replicas = [RedisLimits(client, prefix=redis_prefix) for client in clients]
    # 1e-6 tokens/s: the whole test cannot refill one more token.
    b = Bucket("burst", capacity=50, refill_per_s=1e-6, cost=1)
    results = await asyncio.gather(*(replicas[i % 2].acquire([b]) for i in range(200)))
    assert sum(r.is_admitted for r in results) == 50
    assert all(r.refused_bucket == 0 for r in results if not r.is_admitted)


async def test_slot_of_5_admits_exactly_5_from_two_replicas(clients, redis_prefix):
    replicas = [RedisLimits(client, prefix=redis_prefix) for client in clients]
    slot = ConcurrencySlot("conc", limit=5)
    results = await asyncio.gather(
        *(replicas[i % 2].acquire([], [slot], lease_id=f"l{i}") for i in range(100))
    )
    assert sum(r.is_admitted for r in results) == 5


async def test_lease_expires_at_its_ttl_and_keys_expire(clients, redis_prefix):
    limits = RedisLimits(clients[0], prefix=redis_prefix)
    slot = ConcurrencySlot("c", limit=1)
    assert (await limits.acquire([], [slot], lease_id="a", lease_ttl_s=0.2)).is_admitted
    assert not (await limits.acquire([], [slot], lease_id="b", lease_ttl_s=0.2)).is_admitted
    await asyncio.sleep(0.3)
    assert (await limits.acquire([], [slot], lease_id="b", lease_ttl_s=30)).is_admitted
    assert 30_000 < await clients[0].pttl(f"{redis_prefix}lease:c") <= 31_000
    # A bucket's key lives until a full refill (2 tokens at 1/s: 2 s) plus a margin.
    await limits.acquire([Bucket("b", capacity=10, refill_per_s=1, cost=2)])
    assert 2_000 < await clients[0].pttl(f"{redis_prefix}bucket:b") <= 3_000


async def test_renewal_keeps_the_zset_alive_as_long_as_its_longest_lease(clients, redis_prefix):
    limits = RedisLimits(clients[0], prefix=redis_prefix)
    slot, key = ConcurrencySlot("c", limit=3), f"{redis_prefix}lease:c"
    assert (await limits.acquire([], [slot], lease_id="a", lease_ttl_s=5)).is_admitted
    assert (await limits.acquire([], [slot], lease_id="b", lease_ttl_s=5)).is_admitted
    assert 5_000 < await clients[0].pttl(key) <= 6_000
    await limits.renew([(slot, "a")], 30)
    assert 30_000 < await clients[0].pttl(key) <= 31_000
    await limits.renew([(slot, "b")], 2)  # "a" is still the longest: the key keeps its TTL
    assert 29_000 < await clients[0].pttl(key) <= 31_000
    # A renewal that finds only expired leases purges them and leaves no key behind.
    gone = ConcurrencySlot("gone", limit=1)
    assert (await limits.acquire([], [gone], lease_id="x", lease_ttl_s=0.05)).is_admitted
    await asyncio.sleep(0.1)
    await limits.renew([(gone, "x")], 30)
    assert not await clients[0].exists(f"{redis_prefix}lease:gone")


async def test_documents(clients, redis_prefix):
    docs = RedisDocuments(clients[0], prefix=redis_prefix)
    await docs.put("keys", "b", {"n": 2, "nested": [1, None]})
    await docs.put("keys", "a", {"n": 1})
    await docs.put("keys", "é", {"n": 3})
    await docs.put("other", "c", {})
    assert await docs.get("keys", "b") == {"n": 2, "nested": [1, None]}
    assert [i for i, _ in await docs.list("keys")] == ["a", "b", "é"]
    assert await docs.delete("keys", "a") and not await docs.delete("keys", "a")
    assert await docs.get("keys", "a") is None and await docs.list("none") == []


async def test_counters(clients, redis_prefix):
    counters = RedisCounters(clients[0], prefix=redis_prefix)
    await counters.increment("usage", "k1:m", {"requests": 1, "tokens": 10})
    await counters.increment("usage", "k1:m", {"requests": 1, "usd": 0.25})
    await counters.increment("usage", "k2:m", {"requests": 3}, ttl_s=0.2)
    await counters.increment("usage", "k10:m", {"requests": 4})
    await counters.increment("usage", "l1:m", {"requests": 5})
    assert await counters.read("usage", "k1:m") == {"requests": 2, "tokens": 10, "usd": 0.25}
    assert await counters.read("usage", "nope") == {}
    assert [i for i, _ in await counters.scan("usage", "k")] == ["k10:m", "k1:m", "k2:m"]
    assert await counters.scan("usage", "k1:") == [
        ("k1:m", {"requests": 2, "tokens": 10, "usd": 0.25})
    ]
    await asyncio.sleep(0.3)
    assert await counters.read("usage", "k2:m") == {}
    assert [i for i, _ in await counters.scan("usage")] == ["k10:m", "k1:m", "l1:m"]
    index = await clients[0].zrange(f"{redis_prefix}ctrs:usage", 0, -1)
    assert index == [b"k10:m", b"k1:m", b"l1:m"]  # the expired id left the index


async def test_open_storage_closes_its_client(redis_url, redis_prefix):
    storage = await open_storage(redis_url, key_prefix=redis_prefix)
    await storage.documents.put("ns", "id", {"ok": True})
    assert await storage.documents.get("ns", "id") == {"ok": True}
    assert (await storage.limits.acquire([Bucket("b", 1, 1, 1)])).is_admitted
    await storage.close()


async def test_unreachable_redis_is_a_clear_error_without_the_password(unused_tcp_port):
    url = f"redis://user:s3cret@127.0.0.1:{unused_tcp_port}/0"
    with pytest.raises(ServiceUnavailableError, match="cannot reach Redis") as raised:
        await open_storage(url)
    assert "s3cret" not in raised.value.message and "127.0.0.1" in raised.value.message
