"""One set of cache semantics, run against every CacheStore: memory, SQLite and Redis.

Memory and SQLite take an injected clock that ticks a millisecond per reading (so last-used times
never tie); Redis keeps its own, so its TTL test sleeps past a 0.2 s TTL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from tests.clock import ManualClock
from titan.storage import CacheEntry, CacheStore, open_storage
from titan.storage.memory_cache import MemoryCache
from titan.storage.sqlite import SqliteDatabase
from titan.storage.sqlite_cache import SqliteCache

NS = "exact"


@dataclass
class Harness:
    cache: CacheStore
    now: Callable[[], float]
    fake_clock: ManualClock | None = None

    async def advance(self, seconds: float) -> None:
        if self.fake_clock is not None:
            self.fake_clock.now += seconds
        else:
            await asyncio.sleep(seconds)

    def entry(
        self,
        key: str,
        *,
        tenant: str = "t1",
        model: str = "m1",
        ttl: float = 60.0,
        value: bytes | None = None,
        embedding: bytes | None = None,
        created_at: float | None = None,
    ) -> CacheEntry:
        now = self.now() if created_at is None else created_at
        return CacheEntry(
            key=key,
            value=value if value is not None else f"answer {key}".encode(),
            created_at=now,
            expires_at=now + ttl,
            tags={"tenant": tenant, "model": model},
            embedding=embedding,
        )


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def h(request, tmp_path) -> AsyncIterator[Harness]:
    if request.param == "memory":
        clock = ManualClock(1_700_000_000.0, tick=0.001)
        yield Harness(MemoryCache(now=clock), clock, clock)
    elif request.param == "sqlite":
        clock = ManualClock(1_700_000_000.0, tick=0.001)
        db = await SqliteDatabase.open(tmp_path / "cache.db")
        yield Harness(SqliteCache(db, now=clock), clock, clock)
        await db.close()
    else:
        import redis.asyncio

        from titan.storage.redis_cache import RedisCache

        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        client = redis.asyncio.Redis.from_url(url)
        yield Harness(RedisCache(client, prefix=prefix), time.time)
        await client.aclose()


async def test_roundtrip_with_embedding_and_tags(h):
    e = h.entry("k", embedding=b"\x00\x00\x80?" * 4, value=b"\x00\xffbinary")
    assert await h.cache.put(NS, e, max_entries=10) == []
    got = await h.cache.get(NS, "k")
    assert got == e and got.tags == {"tenant": "t1", "model": "m1"}
    assert isinstance(got.value, bytes) and got.embedding == e.embedding
    plain = h.entry("p")
    await h.cache.put(NS, plain, max_entries=10)
    assert (await h.cache.get(NS, "p")).embedding is None
    assert await h.cache.get(NS, "missing") is None
    assert await h.cache.get("semantic", "k") is None  # namespaces are separate


async def test_put_replaces(h):
    await h.cache.put(NS, h.entry("k", value=b"old", embedding=b"1234"), max_entries=10)
    new = h.entry("k", value=b"newer", tenant="t2")
    assert await h.cache.put(NS, new, max_entries=10) == []
    assert await h.cache.get(NS, "k") == new
    assert await h.cache.stats(NS) == {"entries": 1, "bytes": new.num_bytes}


async def test_ttl_expiry(h):
    short = h.entry("short", ttl=0.2)
    await h.cache.put(NS, short, max_entries=10)
    await h.cache.put(NS, h.entry("long"), max_entries=10)
    assert await h.cache.get(NS, "short") == short
    await h.advance(0.3)
    assert await h.cache.get(NS, "short") is None
    assert [e.key for e in await h.cache.added_since(NS, 0)] == ["long"]
    assert (await h.cache.stats(NS))["entries"] == 1
    assert not await h.cache.delete(NS, "short")  # expired: nothing live to delete


async def test_put_drops_expired_entries_before_live_ones(h):
    await h.cache.put(NS, h.entry("old"), max_entries=2)
    await h.cache.put(NS, h.entry("short", ttl=0.2), max_entries=2)
    await h.advance(0.3)
    # At the cap of 2, the expired entry goes (and is reported), not the least recently used.
    assert await h.cache.put(NS, h.entry("new"), max_entries=2) == ["short"]
    assert await h.cache.get(NS, "old") is not None
    assert await h.cache.stats(NS) == {
        "entries": 2,
        "bytes": h.entry("old").num_bytes + h.entry("new").num_bytes,
    }


async def test_lru_eviction_respects_recency(h):
    for key in "abc":
        assert await h.cache.put(NS, h.entry(key), max_entries=3) == []
    assert await h.cache.get(NS, "a") is not None  # a is now the most recently used
    assert await h.cache.put(NS, h.entry("d"), max_entries=3) == ["b"]
    assert await h.cache.get(NS, "b") is None
    await h.cache.put(NS, h.entry("c"), max_entries=3)  # a put refreshes too
    assert await h.cache.put(NS, h.entry("e"), max_entries=3) == ["a"]
    assert sorted([e.key for e in await h.cache.added_since(NS, 0)]) == ["c", "d", "e"]


async def test_cap_enforced(h):
    evicted = []
    for i in range(8):
        evicted += await h.cache.put(NS, h.entry(f"k{i}"), max_entries=5)
    assert evicted == ["k0", "k1", "k2"]
    assert (await h.cache.stats(NS))["entries"] == 5
    assert await h.cache.put(NS, h.entry("k8"), max_entries=2) == ["k3", "k4", "k5", "k6"]
    assert [e.key for e in await h.cache.added_since(NS, 0)] == ["k7", "k8"]
    assert (await h.cache.stats("semantic"))["entries"] == 0  # the cap is per namespace


async def test_flush_by_tenant_model_and_both(h):
    async def fill() -> None:
        for tenant in ("t1", "t2"):
            for model in ("m1", "m2"):
                await h.cache.put(
                    NS, h.entry(f"{tenant}{model}", tenant=tenant, model=model), max_entries=100
                )
        await h.cache.put("semantic", h.entry("s", tenant="t1"), max_entries=100)

    async def keys() -> list[str]:
        return sorted(e.key for e in await h.cache.added_since(NS, 0))

    await fill()
    assert await h.cache.flush(NS, tenant="t1", model="m2") == 1
    assert await keys() == ["t1m1", "t2m1", "t2m2"]
    assert await h.cache.flush(NS, tenant="t1") == 1
    assert await keys() == ["t2m1", "t2m2"]
    assert await h.cache.flush(NS, model="m2") == 1
    assert await keys() == ["t2m1"]
    assert await h.cache.flush(NS, tenant="nobody") == 0
    await fill()
    assert await h.cache.flush(NS) == 4
    assert await keys() == [] and await h.cache.stats(NS) == {"entries": 0, "bytes": 0}
    assert [e.key for e in await h.cache.added_since("semantic", 0)] == ["s"]


async def test_added_since_order_and_cursor(h):
    base = h.now()
    # Created out of put order, and two at the same instant (ordered by key).
    for key, offset in [("c", 3.0), ("a", 1.0), ("b2", 2.0), ("b1", 2.0), ("d", 4.0)]:
        await h.cache.put(NS, h.entry(key, created_at=base + offset), max_entries=100)
    everything = await h.cache.added_since(NS, 0)
    assert [e.key for e in everything] == ["a", "b1", "b2", "c", "d"]
    assert [e.created_at for e in everything] == [base + x for x in (1, 2, 2, 3, 4)]
    page = await h.cache.added_since(NS, 0, limit=2)
    assert [e.key for e in page] == ["a", "b1"]
    # Strictly after the cursor: the last seen created_at is not returned again.
    assert [e.key for e in await h.cache.added_since(NS, base + 2.0, limit=2)] == ["c", "d"]
    assert await h.cache.added_since(NS, base + 4.0) == []
    assert (await h.cache.added_since(NS, base + 3.0))[0] == everything[4]


async def test_stats_count_entries_and_bytes(h):
    assert await h.cache.stats(NS) == {"entries": 0, "bytes": 0}
    entries = [h.entry("a", value=b"x" * 100), h.entry("bb", embedding=b"e" * 1536)]
    for e in entries:
        await h.cache.put(NS, e, max_entries=10)
    assert await h.cache.stats(NS) == {"entries": 2, "bytes": 100 + 1 + 1536 + len("answer bb") + 2}
    await h.cache.delete(NS, "a")
    assert await h.cache.stats(NS) == {"entries": 1, "bytes": entries[1].num_bytes}


async def test_delete(h):
    await h.cache.put(NS, h.entry("k"), max_entries=10)
    assert await h.cache.delete(NS, "k")
    assert not await h.cache.delete(NS, "k")
    assert not await h.cache.delete(NS, "never")
    assert await h.cache.get(NS, "k") is None and await h.cache.added_since(NS, 0) == []


async def test_open_storage_sets_a_cache(tmp_path):
    storage = await open_storage("memory://", now=lambda: 5.0)
    assert isinstance(storage.cache, MemoryCache)
    e = CacheEntry("k", b"v", created_at=4.0, expires_at=6.0)
    await storage.cache.put(NS, e, max_entries=1)
    assert await storage.cache.get(NS, "k") == e  # the injected clock: 5.0 < 6.0
    await storage.close()
    storage = await open_storage(f"sqlite:///{tmp_path}/s.db")
    assert isinstance(storage.cache, SqliteCache)
    await storage.close()


@pytest.fixture
async def replicas(redis_url, redis_prefix) -> AsyncIterator[list]:
    import redis.asyncio

    from titan.storage.redis_cache import RedisCache

    clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(2)]
    yield [RedisCache(client, prefix=redis_prefix) for client in clients], clients[0]
    for client in clients:
        await client.aclose()


def redis_entry(key: str, ttl: float = 60.0, **tags: str) -> CacheEntry:
    now = time.time()
    return CacheEntry(key, f"v{key}".encode(), created_at=now, expires_at=now + ttl, tags=tags)


@pytest.mark.redis
async def test_redis_replicas_share_entries(replicas, redis_prefix):
    (first, second), client = replicas
    e = redis_entry("k", tenant="t1", model="m1")
    await first.put(NS, e, max_entries=10)
    assert await second.get(NS, "k") == e
    assert [x.key for x in await second.added_since(NS, 0)] == ["k"]
    assert await second.flush(NS, tenant="t1") == 1
    assert await first.get(NS, "k") is None
    # The entry's hash expires with it, in Redis, at expires_at.
    await first.put(NS, redis_entry("t", ttl=30), max_entries=10)
    assert 29_000 < await client.pttl(f"{redis_prefix}cache:{NS}:e:t") <= 30_001


@pytest.mark.redis
async def test_redis_concurrent_puts_from_two_replicas_leave_exactly_the_cap(replicas):
    (first, second), client = replicas
    entries = [redis_entry(f"k{i:03}") for i in range(200)]
    evicted = await asyncio.gather(
        *((first if i % 2 else second).put(NS, e, max_entries=10) for i, e in enumerate(entries))
    )
    assert sum(len(keys) for keys in evicted) == 190  # each key evicted once: no over-eviction
    assert (await first.stats(NS))["entries"] == 10
    survivors = await second.added_since(NS, 0)
    assert len(survivors) == 10
    assert (await second.stats(NS))["bytes"] == sum(e.num_bytes for e in survivors)
    hashes = [k async for k in client.scan_iter(match=f"*cache:{NS}:e:*", count=1000)]
    assert len(hashes) == 10


@pytest.mark.redis
async def test_redis_forgets_hashes_that_vanished(replicas, redis_prefix):
    (cache, _), client = replicas
    for key in "abc":
        await cache.put(NS, redis_entry(key), max_entries=10)
    # As if a maxmemory policy evicted it: the hash is gone, the indexes still name it.
    await client.delete(f"{redis_prefix}cache:{NS}:e:b")
    assert [e.key for e in await cache.added_since(NS, 0)] == ["a", "c"]
    assert await cache.stats(NS) == {
        "entries": 2,
        "bytes": redis_entry("a").num_bytes + redis_entry("c").num_bytes,
    }


@pytest.mark.redis
async def test_open_storage_sets_a_redis_cache(redis_url, redis_prefix):
    from titan.storage.redis_cache import RedisCache

    storage = await open_storage(redis_url, key_prefix=redis_prefix)
    assert isinstance(storage.cache, RedisCache)
    await storage.cache.put(NS, redis_entry("k"), max_entries=1)
    assert (await storage.cache.stats(NS))["entries"] == 1
    await storage.close()
