"""Concurrency leases are short and renewed while their request runs: a running request keeps its
slots however long it takes, a finished one frees them, and a replica that stops renewing (killed)
loses them within one lease TTL. The memory store with an injected clock, then the renewal loop in
real time, then two replicas on a real Redis."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from tests.clock import ManualClock
from titan.config.admission import Limits
from titan.errors import RateLimitError
from titan.limits.rates import RateLimiter, Scope
from titan.storage.base import ConcurrencySlot
from titan.storage.memory import MemoryLimits

TTL = 30.0


class RenewingLimits(MemoryLimits):
    """Records each renewal round; fails the first ``num_failures``; waits for ``gate``."""

    def __init__(self, now=time.monotonic, *, num_failures: int = 0) -> None:
        super().__init__(now)
        self.rounds: list[list[tuple[str, str]]] = []
        self.num_failures = num_failures
        self.gate: asyncio.Event | None = None

    async def renew(
        self, leases: Sequence[tuple[ConcurrencySlot, str]], lease_ttl_s: float
    ) -> None:
        self.rounds.append([(slot.key, lease_id) for slot, lease_id in leases])
        if len(self.rounds) <= self.num_failures:
            raise ConnectionError("store down")
        if self.gate is not None:
            await self.gate.wait()
        await super().renew(leases, lease_ttl_s)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> RenewingLimits:
    return RenewingLimits(clock)


def conc(limit: int, kind: str = "key", ident: str = "k1") -> Scope:
    return Scope(kind, ident, Limits(max_concurrency=limit))


async def is_refused(limiter: RateLimiter, scopes: list[Scope], lease_id: str) -> bool:
    try:
        reservation = await limiter.reserve(scopes, 1, lease_id)
    except RateLimitError as error:
        assert error.code == "concurrency_exceeded"
        return True
    await reservation.finish(1)
    return False


async def test_a_running_request_keeps_its_slot_for_many_ttls(store, clock) -> None:
    limiter = RateLimiter(store, lease_ttl_s=TTL)
    assert limiter.renew_interval_s == TTL / 3
    running = await limiter.reserve([conc(1)], 1, "a")
    for _ in range(30):  # 300 s, ten TTLs, renewed every TTL/3
        clock.now += TTL / 3
        assert await limiter.renew_leases() == 1
    assert await is_refused(limiter, [conc(1)], "b")
    await running.finish(1)
    assert limiter.num_held == 0
    assert await limiter.renew_leases() == 0  # nothing held: the store is not asked
    assert len(store.rounds) == 30
    assert not await is_refused(limiter, [conc(1)], "b")


async def test_one_round_renews_every_slot_of_every_running_request(store) -> None:
    limiter = RateLimiter(store, lease_ttl_s=TTL)
    scopes = [conc(5), conc(5, "tenant", "t"), conc(5, "model", "m")]
    first = await limiter.reserve(scopes, 1, "a")
    held = await limiter.reserve(scopes[:1], 1, "b")
    await limiter.reserve([Scope("key", "k2", Limits(rpm=5))], 1, "no-slot")  # nothing to renew
    await first.finish(1)
    second = await limiter.reserve(scopes[1:], 1, "c")
    assert await limiter.renew_leases() == 3
    assert sorted(store.rounds[0]) == [
        ("rl:key:k1:conc", "b"),
        ("rl:model:m:conc", "c"),
        ("rl:tenant:t:conc", "c"),
    ]
    await second.finish(1)
    await held.finish(1)


async def test_a_replica_that_stops_renewing_frees_its_slots_after_one_ttl(store, clock) -> None:
    killed, alive = RateLimiter(store, lease_ttl_s=TTL), RateLimiter(store, lease_ttl_s=TTL)
    held = [await killed.reserve([conc(2)], 1, f"k{i}") for i in range(2)]
    mine = await alive.reserve([conc(9, "tenant", "t")], 1, "mine")  # alive keeps renewing
    for _ in range(2):
        clock.now += TTL / 3
        await alive.renew_leases()
        assert await is_refused(alive, [conc(2)], "x")
    clock.now += TTL / 3 - 0.01
    assert await is_refused(alive, [conc(2)], "x")
    clock.now += 0.01  # one TTL after "killed" took them (it never renewed nor finished)
    assert not await is_refused(alive, [conc(2)], "x")
    assert len(held) == 2 and killed.num_held == 2
    await alive.renew_leases()
    clock.now += TTL / 3  # "mine" is older than one TTL too, but renewed
    tenant_slot = ConcurrencySlot("rl:tenant:t:conc", 1)
    assert not (await store.acquire([], [tenant_slot], lease_id="y")).is_admitted
    await mine.finish(1)


async def test_a_renewal_racing_a_finish_does_not_take_the_slot_back(store) -> None:
    limiter = RateLimiter(store, lease_ttl_s=TTL)
    reservation = await limiter.reserve([conc(1)], 1, "a")
    store.gate = asyncio.Event()
    renewal = asyncio.create_task(limiter.renew_leases())  # has read "a" as live
    while not store.rounds:
        await asyncio.sleep(0)
    await reservation.finish(1)  # released while the renewal is in flight
    store.gate.set()
    assert await renewal == 1
    assert not await is_refused(limiter, [conc(1)], "b")


async def test_a_reservation_nobody_can_finish_is_not_renewed_forever(store) -> None:
    limiter = RateLimiter(store, lease_ttl_s=TTL)
    await limiter.reserve([conc(1)], 1, "leaked")  # dropped unfinished
    gc.collect()
    assert limiter.num_held == 0 and await limiter.renew_leases() == 0


async def test_the_loop_survives_store_errors_logs_once_and_stops_on_close(caplog) -> None:
    store = RenewingLimits(num_failures=3)
    limiter = RateLimiter(store, lease_ttl_s=0.03)  # a round every 10 ms
    reservation = await limiter.reserve([conc(1)], 1, "a")
    caplog.set_level(logging.INFO, logger="titan.limits")
    limiter.start()
    limiter.start()  # idempotent: still one loop
    deadline = time.monotonic() + 5
    while len(store.rounds) < 6 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await limiter.close()
    await limiter.close()
    assert len(store.rounds) >= 6
    num_rounds = len(store.rounds)
    await asyncio.sleep(0.05)
    assert len(store.rounds) == num_rounds  # closed: no more rounds
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    failed = [m for m in messages if "renewing concurrency leases failed" in m[1]]
    assert len(failed) == 1 and failed[0][0] == "ERROR"  # one line for three failures
    assert ("INFO", "renewing concurrency leases works again") in messages
    await reservation.finish(1)


def test_the_lease_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lease_ttl_s"):
        RateLimiter(MemoryLimits(), lease_ttl_s=0)


# ---- two replicas on a real Redis --------------------------------------------------------------


@pytest.fixture
async def two_replicas(redis_url, redis_prefix) -> AsyncIterator[tuple[RateLimiter, RateLimiter]]:
    import redis.asyncio

    from titan.storage.redis import RedisLimits

    clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(2)]
    replicas = [RateLimiter(RedisLimits(c, prefix=redis_prefix), lease_ttl_s=1.0) for c in clients]
    yield replicas[0], replicas[1]
    for replica, client in zip(replicas, clients, strict=True):
        await replica.close()
        await client.aclose()


@pytest.mark.redis
async def test_on_redis_a_killed_replicas_slots_free_within_one_ttl(two_replicas) -> None:
    killed, survivor = two_replicas
    killed.start()
    held = [await killed.reserve([conc(2)], 1, f"k{i}") for i in range(2)]
    await asyncio.sleep(1.5)  # past one TTL: the renewals keep them
    assert await is_refused(survivor, [conc(2)], "s")
    await killed.close()  # SIGKILL: it stops renewing and never finishes
    killed_at = time.monotonic()
    assert await is_refused(survivor, [conc(2)], "s")
    while await is_refused(survivor, [conc(2)], "s"):
        assert time.monotonic() - killed_at < 2.0, "the dead replica's slots never freed"
        await asyncio.sleep(0.02)
    # Renewed at most TTL/3 before the kill: free between 2/3 of a TTL and one TTL after it.
    assert 0.5 < time.monotonic() - killed_at < 1.3
    assert len(held) == 2
