"""The memory stores with an injected clock: the exact bucket arithmetic every store shares."""

from __future__ import annotations

import math

import pytest

from tests.clock import ManualClock
from titan.storage.base import Bucket, ConcurrencySlot, Settlement
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits


@pytest.fixture
def limits(clock: ManualClock) -> MemoryLimits:
    return MemoryLimits(now=clock)


def rpm(cost: float = 1, key: str = "k") -> Bucket:
    return Bucket(key, capacity=60, refill_per_s=1, cost=cost)


async def test_a_new_bucket_is_full_and_refills_up_to_capacity(limits, clock):
    got = await limits.acquire([rpm(50)])
    assert got.is_admitted and got.remaining == (10,) and got.now == 1000.0
    clock.now += 20
    assert await limits.peek([rpm()]) == (30,)
    clock.now += 1000
    assert await limits.peek([rpm()]) == (60,)


async def test_refused_bucket_reports_its_index_and_retry_after(limits, clock):
    await limits.acquire([rpm(58)])
    clock.now += 0.5
    got = await limits.acquire([rpm(1, "a"), rpm(5)])
    assert not got.is_admitted
    assert got.refused_bucket == 1 and got.refused_slot is None
    assert got.retry_after_s == pytest.approx(2.5)  # (5 - 2.5) / 1
    assert got.remaining == (60, 2.5)
    assert await limits.peek([rpm(key="a")]) == (60,)  # all or nothing: "a" untouched


async def test_cost_above_capacity_never_fits(limits):
    got = await limits.acquire([rpm(61)])
    assert not got.is_admitted and got.retry_after_s == math.inf
    zero_refill = Bucket("z", capacity=5, refill_per_s=0, cost=6)
    assert (await limits.acquire([zero_refill])).retry_after_s == math.inf


async def test_exactly_the_cost_is_admitted(limits):
    assert (await limits.acquire([rpm(60)])).remaining == (0,)
    assert not (await limits.acquire([rpm(1)])).is_admitted


async def test_settle_refund_is_capped_at_capacity(limits):
    await limits.acquire([rpm(10)])
    await limits.settle([Settlement(rpm(), 4)])
    assert await limits.peek([rpm()]) == (54,)
    await limits.settle([Settlement(rpm(), 100)])
    assert await limits.peek([rpm()]) == (60,)


async def test_negative_settle_is_debt_that_refill_pays_back(limits, clock):
    await limits.acquire([rpm(60)])
    await limits.settle([Settlement(rpm(), -30)])
    assert await limits.peek([rpm()]) == (-30,)
    got = await limits.acquire([rpm(1)])
    assert not got.is_admitted and got.retry_after_s == pytest.approx(31)
    clock.now += 31
    assert (await limits.acquire([rpm(1)])).is_admitted


async def test_settle_on_an_unseen_bucket_starts_full(limits):
    await limits.settle([Settlement(rpm(), -5)])
    assert await limits.peek([rpm()]) == (55,)


async def test_concurrency_limit_release_and_lease_expiry(limits, clock):
    slot = ConcurrencySlot("c", limit=2)
    assert (await limits.acquire([], [slot], lease_id="a", lease_ttl_s=10)).is_admitted
    assert (await limits.acquire([], [slot], lease_id="b", lease_ttl_s=100)).is_admitted
    got = await limits.acquire([rpm()], [ConcurrencySlot("x", 5), slot], lease_id="c")
    assert not got.is_admitted and got.refused_slot == 1 and got.retry_after_s is None
    assert got.refused_bucket is None
    assert await limits.peek([rpm()]) == (60,)  # a refused slot takes no tokens
    await limits.release([slot], "b")
    assert (await limits.acquire([], [slot], lease_id="c", lease_ttl_s=100)).is_admitted
    assert not (await limits.acquire([], [slot], lease_id="d")).is_admitted
    clock.now += 10  # lease "a" expires at its TTL
    assert (await limits.acquire([], [slot], lease_id="d")).is_admitted


async def test_renew_extends_a_live_lease_only(limits, clock):
    slot = ConcurrencySlot("c", limit=1)
    assert (await limits.acquire([], [slot], lease_id="a", lease_ttl_s=10)).is_admitted
    for _ in range(5):  # 40 s on a 10 s lease, renewed every 8 s
        clock.now += 8
        await limits.renew([(slot, "a")], 10)
    assert not (await limits.acquire([], [slot], lease_id="b")).is_admitted
    clock.now += 10  # not renewed any more: it expires exactly at its TTL
    await limits.renew([(slot, "a")], 10)  # too late: an expired lease stays gone
    assert (await limits.acquire([], [slot], lease_id="b", lease_ttl_s=10)).is_admitted
    await limits.release([slot], "b")
    await limits.renew([(slot, "b"), (ConcurrencySlot("unseen", 1), "b")], 10)
    assert (await limits.acquire([], [slot], lease_id="c")).is_admitted  # "b" stays released


async def test_slots_need_a_lease_id(limits):
    with pytest.raises(ValueError, match="lease_id"):
        await limits.acquire([], [ConcurrencySlot("c", 1)])


async def test_sweep_forgets_only_full_buckets(clock, monkeypatch):
    monkeypatch.setattr("titan.storage.memory.SWEEP_EVERY", 2)
    limits = MemoryLimits(now=clock)
    await limits.acquire([rpm(1, "full-again"), rpm(60, "empty")])
    clock.now += 1
    await limits.acquire([])  # the sweep runs here
    assert await limits.peek([rpm(key="full-again"), rpm(key="empty")]) == (60, 1)


async def test_documents():
    docs = MemoryDocuments()
    await docs.put("keys", "b", {"n": 2, "tags": ("x",)})
    await docs.put("keys", "a", {"n": 1})
    await docs.put("other", "c", {})
    got = await docs.get("keys", "b")
    assert got == {"n": 2, "tags": ["x"]}  # JSON semantics, as every store has
    got["n"] = 99
    assert (await docs.get("keys", "b"))["n"] == 2  # callers get copies
    assert await docs.list("keys") == [("a", {"n": 1}), ("b", {"n": 2, "tags": ["x"]})]
    assert await docs.delete("keys", "a") and not await docs.delete("keys", "a")
    assert await docs.get("keys", "a") is None and await docs.list("none") == []


async def test_counters_increment_read_scan_and_expire(clock):
    counters = MemoryCounters(now=clock)
    await counters.increment("usage", "k1:2024-01", {"requests": 1, "tokens": 10})
    await counters.increment("usage", "k1:2024-01", {"requests": 1, "usd": 0.5})
    await counters.increment("usage", "k2:2024-01", {"requests": 3}, ttl_s=60)
    await counters.increment("usage", "k10:2024-01", {"requests": 4})
    assert await counters.read("usage", "k1:2024-01") == {"requests": 2, "tokens": 10, "usd": 0.5}
    assert await counters.read("usage", "nope") == {}
    ids = [i for i, _ in await counters.scan("usage")]
    assert ids == ["k10:2024-01", "k1:2024-01", "k2:2024-01"]  # code point order: "0" < ":"
    assert await counters.scan("usage", "k1:") == [
        ("k1:2024-01", {"requests": 2, "tokens": 10, "usd": 0.5})
    ]
    clock.now += 30
    await counters.increment("usage", "k2:2024-01", {"requests": 1})  # keeps its expiry
    clock.now += 30
    assert await counters.read("usage", "k2:2024-01") == {}
    assert [i for i, _ in await counters.scan("usage", "k2")] == []
    await counters.increment("usage", "k2:2024-01", {"requests": 1})
    assert await counters.read("usage", "k2:2024-01") == {"requests": 1}  # restarted from zero
