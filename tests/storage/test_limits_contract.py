"""One set of limit semantics, run against every LimitStore: memory and Redis.

Redis uses its own clock (real time), so these tests never wait on a refill: buckets refill at a
negligible rate, or assertions allow for the milliseconds a test takes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from titan.storage.base import Bucket, ConcurrencySlot, LimitStore, Settlement
from titan.storage.memory import MemoryLimits

SLOW = 1e-9  # tokens per second: nothing refills during a test


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def limits(request) -> AsyncIterator[LimitStore]:
    if request.param == "memory":
        yield MemoryLimits()
        return
    import redis.asyncio

    from titan.storage.redis import RedisLimits

    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    client = redis.asyncio.Redis.from_url(url)
    yield RedisLimits(client, prefix=prefix)
    await client.aclose()


def bucket(key: str, cost: float, capacity: float = 10, refill: float = SLOW) -> Bucket:
    return Bucket(key, capacity=capacity, refill_per_s=refill, cost=cost)


async def test_new_bucket_is_full(limits):
    got = await limits.acquire([bucket("a", 3)])
    assert got.is_admitted and got.remaining == pytest.approx((7,))
    assert got.refused_bucket is None and got.refused_slot is None and got.retry_after_s is None
    assert got.now > 0


async def test_all_or_nothing_over_several_buckets(limits):
    await limits.acquire([bucket("b", 8)])
    got = await limits.acquire([bucket("a", 5), bucket("b", 5), bucket("c", 50)])
    assert not got.is_admitted and got.refused_bucket == 1  # the first that refused
    assert got.remaining == pytest.approx((10, 2, 10))
    assert await limits.peek([bucket("a", 0), bucket("b", 0)]) == pytest.approx((10, 2))


async def test_retry_after(limits):
    await limits.acquire([bucket("a", 10, refill=2)])
    got = await limits.acquire([bucket("a", 4, refill=2)])
    assert not got.is_admitted and got.retry_after_s == pytest.approx(2, abs=0.1)  # 4 / 2
    got = await limits.acquire([bucket("a", 11, refill=2)])
    assert got.retry_after_s == math.inf


async def test_settle_refund_capped_and_debt(limits):
    await limits.acquire([bucket("a", 6)])
    await limits.settle([Settlement(bucket("a", 0), 2)])
    assert await limits.peek([bucket("a", 0)]) == pytest.approx((6,))
    await limits.settle([Settlement(bucket("a", 0), 100)])
    assert await limits.peek([bucket("a", 0)]) == pytest.approx((10,))
    await limits.settle([Settlement(bucket("a", 0), -25)])
    assert await limits.peek([bucket("a", 0)]) == pytest.approx((-15,))
    got = await limits.acquire([bucket("a", 1, refill=4)])
    assert not got.is_admitted and got.retry_after_s == pytest.approx(4, abs=0.1)  # 16 / 4


async def test_concurrency_limit_and_release(limits):
    slot = ConcurrencySlot("s", limit=2)
    assert (await limits.acquire([], [slot], lease_id="1")).is_admitted
    assert (await limits.acquire([], [slot], lease_id="2")).is_admitted
    got = await limits.acquire([bucket("a", 1)], [ConcurrencySlot("t", 1), slot], lease_id="3")
    assert not got.is_admitted and got.refused_slot == 1 and got.retry_after_s is None
    assert await limits.peek([bucket("a", 0)]) == pytest.approx((10,))  # nothing taken
    assert await limits.peek([]) == ()
    await limits.release([slot], "1")
    assert (await limits.acquire([], [slot], lease_id="3")).is_admitted
    # "t" admitted nothing, so it holds no lease: releasing an unknown lease is harmless.
    await limits.release([ConcurrencySlot("t", 1), slot], "nope")
    assert (await limits.acquire([], [ConcurrencySlot("t", 1)], lease_id="4")).is_admitted


async def test_empty_acquire_and_settle(limits):
    assert (await limits.acquire([])).is_admitted
    await limits.settle([])
    await limits.release([], "x")


async def test_renew_extends_live_leases_and_never_resurrects(limits):
    """Real time on both stores: "a" outlives its first TTL only because it was renewed; "x"
    expired, "gone" was released and "never" never existed, and renewing them changes nothing."""
    s, o, r = ConcurrencySlot("s", 1), ConcurrencySlot("o", 1), ConcurrencySlot("r", 1)
    assert (await limits.acquire([], [s], lease_id="a", lease_ttl_s=0.6)).is_admitted
    assert (await limits.acquire([], [o], lease_id="x", lease_ttl_s=0.1)).is_admitted
    assert (await limits.acquire([], [r], lease_id="gone", lease_ttl_s=60)).is_admitted
    await limits.release([r], "gone")
    await asyncio.sleep(0.35)  # "x" has expired (nothing has purged it yet)
    await limits.renew([(s, "a"), (o, "x"), (r, "gone"), (s, "never")], 0.6)
    await asyncio.sleep(0.35)  # past "a"'s first expiry, before its renewed one
    assert not (await limits.acquire([], [s], lease_id="b")).is_admitted
    assert (await limits.acquire([], [o], lease_id="y")).is_admitted
    assert (await limits.acquire([], [r], lease_id="z")).is_admitted
    await limits.release([s], "a")
    assert (await limits.acquire([], [s], lease_id="b")).is_admitted  # "never" holds nothing
    await limits.renew([], 1.0)
