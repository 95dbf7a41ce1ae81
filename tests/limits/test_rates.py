"""Rate, token and concurrency limits over the memory store with an injected clock: the
all-or-nothing reservation, settlement, OpenAI's x-ratelimit-* headers and the errors."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.clock import ManualClock
from titan.config.admission import Limits
from titan.errors import RateLimitError
from titan.limits.rates import RateLimiter, Reservation, Scope, format_reset
from titan.storage.base import Acquisition, Bucket, ConcurrencySlot, Settlement
from titan.storage.memory import MemoryLimits


class CountingLimits(MemoryLimits):
    """Counts every call to the store, to tell requests without limits from the rest."""

    def __init__(self, now: ManualClock) -> None:
        super().__init__(now)
        self.calls: list[str] = []

    async def acquire(
        self,
        buckets: Sequence[Bucket],
        slots: Sequence[ConcurrencySlot] = (),
        *,
        lease_id: str = "",
        lease_ttl_s: float = 600.0,
    ) -> Acquisition:
        self.calls.append("acquire")
        return await super().acquire(buckets, slots, lease_id=lease_id, lease_ttl_s=lease_ttl_s)

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        self.calls.append("settle")
        await super().settle(settlements)

    async def release(self, slots: Sequence[ConcurrencySlot], lease_id: str) -> None:
        self.calls.append("release")
        await super().release(slots, lease_id)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> CountingLimits:
    return CountingLimits(clock)


@pytest.fixture
def limiter(store: CountingLimits) -> RateLimiter:
    return RateLimiter(store)


def key(**limits: int) -> Scope:
    return Scope("key", "k1", Limits(**limits))


def tpm_bucket(scope: Scope, limiter: RateLimiter) -> Bucket:
    """The scope's tokens/min bucket as the limiter names it (cost is irrelevant to peek)."""
    tpm = float(scope.limits.tpm or 0)
    return Bucket(f"{limiter.prefix}:{scope.kind}:{scope.ident}:tpm", tpm, tpm / 60.0, 0.0)


async def refused(limiter: RateLimiter, scopes: list[Scope], tokens: int = 1) -> RateLimitError:
    with pytest.raises(RateLimitError) as caught:
        await limiter.reserve(scopes, tokens, "lease")
    return caught.value


# ---- requests per minute -----------------------------------------------------------------------


async def test_rpm_admits_exactly_rpm_requests_then_refuses(limiter: RateLimiter) -> None:
    scope = key(rpm=10)
    for i in range(10):
        reservation = await limiter.reserve([scope], 1, f"r{i}")
        assert reservation.headers["x-ratelimit-limit-requests"] == "10"
        assert reservation.headers["x-ratelimit-remaining-requests"] == str(9 - i)
    error = await refused(limiter, [scope])
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert error.retry_after == pytest.approx(60 / 10)
    assert error.headers["x-ratelimit-limit-requests"] == "10"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-reset-requests"] == "1m0s"  # all 10 back after a minute
    assert "key 'k1'" in error.message


async def test_rpm_refills_over_time(limiter: RateLimiter, clock: ManualClock) -> None:
    scope = key(rpm=60)  # one request a second
    for i in range(60):
        await limiter.reserve([scope], 1, f"r{i}")
    error = await refused(limiter, [scope])
    assert error.retry_after == pytest.approx(1.0)
    clock.now += 0.5
    error = await refused(limiter, [scope])
    assert error.retry_after == pytest.approx(0.5)
    clock.now += 0.5
    await limiter.reserve([scope], 1, "again")
    await refused(limiter, [scope])
    clock.now += 3.0
    for i in range(3):
        await limiter.reserve([scope], 1, f"later{i}")
    await refused(limiter, [scope])


async def test_refusal_changes_nothing(limiter: RateLimiter, clock: ManualClock) -> None:
    scope = key(rpm=2)
    await limiter.reserve([scope], 1, "a")
    await limiter.reserve([scope], 1, "b")
    for _ in range(5):
        await refused(limiter, [scope])
    clock.now += 30.0  # one request back: the refusals did not push it further away
    await limiter.reserve([scope], 1, "c")


# ---- tokens per minute -------------------------------------------------------------------------


async def test_tpm_reserves_then_settle_refunds_the_overestimate(
    limiter: RateLimiter, store: CountingLimits
) -> None:
    scope = key(tpm=1_000)
    bucket = tpm_bucket(scope, limiter)
    reservation = await limiter.reserve([scope], 500, "a")  # prompt + max_tokens
    assert reservation.reserved_tokens == 500
    assert reservation.headers["x-ratelimit-limit-tokens"] == "1000"
    assert reservation.headers["x-ratelimit-remaining-tokens"] == "500"
    assert await store.peek([bucket]) == (500.0,)
    await reservation.finish(100)
    assert await store.peek([bucket]) == (900.0,)  # 400 refunded


async def test_settle_above_the_reservation_charges_more(
    limiter: RateLimiter, store: CountingLimits, clock: ManualClock
) -> None:
    scope = key(tpm=1_000)
    bucket = tpm_bucket(scope, limiter)
    reservation = await limiter.reserve([scope], 500, "a")
    await reservation.finish(1_200)  # 700 more than reserved: 200 tokens of debt
    assert await store.peek([bucket]) == (-200.0,)
    error = await refused(limiter, [scope], 100)
    assert error.code == "tokens_exceeded"
    assert error.retry_after == pytest.approx(300 / (1_000 / 60))  # the debt is paid back first
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    clock.now += 18.0  # 300 tokens refilled
    await limiter.reserve([scope], 100, "b")


async def test_finish_without_actual_tokens_keeps_the_reservation(
    limiter: RateLimiter, store: CountingLimits
) -> None:
    scope = key(tpm=1_000)
    reservation = await limiter.reserve([scope], 500, "a")
    await reservation.finish(None)
    assert await store.peek([tpm_bucket(scope, limiter)]) == (500.0,)
    assert "settle" not in store.calls


async def test_request_larger_than_the_tpm_capacity_is_refused_at_once(
    limiter: RateLimiter, store: CountingLimits
) -> None:
    scope = key(tpm=1_000)
    error = await refused(limiter, [scope], 1_001)
    assert error.status_code == 429
    assert error.code == "tokens_exceeded"
    assert error.retry_after is None  # waiting never helps
    assert "1001" in error.message and "1000" in error.message
    assert store.calls == []
    await limiter.reserve([scope], 1_000, "fits")  # exactly the capacity is allowed


# ---- several scopes ----------------------------------------------------------------------------


async def test_scopes_are_all_or_nothing(limiter: RateLimiter, store: CountingLimits) -> None:
    own = Scope("key", "k1", Limits(rpm=100, tpm=10_000))
    tenant = Scope("tenant", "acme", Limits(rpm=2))
    model = Scope("model", "m", Limits(rpm=1_000))
    scopes = [own, tenant, model]
    await limiter.reserve(scopes, 10, "a")
    await limiter.reserve(scopes, 10, "b")
    error = await refused(limiter, scopes, 10)
    assert error.code == "rate_limit_exceeded"
    assert "tenant 'acme'" in error.message
    key_buckets = [
        Bucket("rl:key:k1:rpm", 100.0, 100 / 60, 1.0),
        tpm_bucket(own, limiter),
        Bucket("rl:model:m:rpm", 1_000.0, 1_000 / 60, 1.0),
    ]
    assert await store.peek(key_buckets) == (98.0, 9_980.0, 998.0)  # the refusal charged nothing
    # Another tenant of the same key's model is unaffected by acme's limit.
    other = Scope("tenant", "other", Limits(rpm=2))
    await limiter.reserve([own, other, model], 10, "c")
    assert await store.peek(key_buckets) == (97.0, 9_970.0, 997.0)


async def test_tightest_bucket_speaks_in_the_headers(limiter: RateLimiter) -> None:
    own = Scope("key", "k1", Limits(rpm=100, tpm=5_000))
    tenant = Scope("tenant", "acme", Limits(rpm=5, tpm=100_000))
    reservation = await limiter.reserve([own, tenant], 1_000, "a")
    assert reservation.headers == {
        "x-ratelimit-limit-requests": "5",  # the tenant: 4 left of 5
        "x-ratelimit-remaining-requests": "4",
        "x-ratelimit-reset-requests": "12s",
        "x-ratelimit-limit-tokens": "5000",  # the key: 4000 left of 5000
        "x-ratelimit-remaining-tokens": "4000",
        "x-ratelimit-reset-tokens": "12s",
    }


async def test_refused_tpm_reports_its_retry_and_scope(
    limiter: RateLimiter, clock: ManualClock
) -> None:
    own = Scope("key", "k1", Limits(rpm=100))
    model = Scope("model", "m", Limits(tpm=600))  # 10 tokens a second
    await limiter.reserve([own, model], 500, "a")
    error = await refused(limiter, [own, model], 200)
    assert error.code == "tokens_exceeded"
    assert "model 'm'" in error.message
    assert error.retry_after == pytest.approx(10.0)
    assert error.headers["x-ratelimit-remaining-tokens"] == "100"
    clock.now += 10.0
    await limiter.reserve([own, model], 200, "b")


# ---- concurrency -------------------------------------------------------------------------------


async def test_concurrency_limit_and_release(limiter: RateLimiter) -> None:
    scope = key(max_concurrency=2)
    first = await limiter.reserve([scope], 1, "a")
    second = await limiter.reserve([scope], 1, "b")
    error = await refused(limiter, [scope])
    assert error.status_code == 429
    assert error.code == "concurrency_exceeded"
    assert error.retry_after is not None and error.retry_after > 0
    assert "at most 2" in error.message
    await first.finish(1)
    third = await limiter.reserve([scope], 1, "c")
    await refused(limiter, [scope])
    await second.finish(1)
    await third.finish(1)
    for lease in ("d", "e"):
        await limiter.reserve([scope], 1, lease)


async def test_finish_twice_is_harmless(limiter: RateLimiter, store: CountingLimits) -> None:
    scope = key(tpm=1_000, max_concurrency=1)
    reservation = await limiter.reserve([scope], 500, "a")
    await reservation.finish(100)
    calls = list(store.calls)
    await reservation.finish(100)
    await reservation.finish(300)
    assert store.calls == calls  # nothing settled or released twice
    assert reservation.is_released
    assert await store.peek([tpm_bucket(scope, limiter)]) == (900.0,)
    other = await limiter.reserve([scope], 1, "b")  # the slot is free, once
    await refused(limiter, [scope])
    await other.finish(1)


async def test_concurrency_refusal_charges_no_bucket(
    limiter: RateLimiter, store: CountingLimits
) -> None:
    scope = key(rpm=10, max_concurrency=1)
    await limiter.reserve([scope], 1, "a")
    for _ in range(3):
        error = await refused(limiter, [scope])
        assert error.code == "concurrency_exceeded"
    assert await store.peek([Bucket("rl:key:k1:rpm", 10.0, 10 / 60, 1.0)]) == (9.0,)


# ---- no limits ---------------------------------------------------------------------------------


async def test_scopes_without_limits_ask_the_store_nothing(
    limiter: RateLimiter, store: CountingLimits
) -> None:
    scopes = [Scope("key", "k1", Limits()), Scope("tenant", "t", Limits())]
    reservation = await limiter.reserve(scopes, 10_000_000, "a")
    assert isinstance(reservation, Reservation)
    assert reservation.headers == {}
    await reservation.finish(5)
    await reservation.finish(None)
    no_scopes = await limiter.reserve([], 10, "b")
    await no_scopes.finish(10)
    assert store.calls == []


async def test_rpm_only_scope_settles_nothing(limiter: RateLimiter, store: CountingLimits) -> None:
    reservation = await limiter.reserve([key(rpm=10)], 500, "a")
    await reservation.finish(100)
    assert store.calls == ["acquire"]  # no token bucket to settle, no slot to release


# ---- reset durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (-1.0, "0ms"),
        (0.02, "20ms"),
        (0.0201, "21ms"),
        (0.5, "500ms"),
        (1.0, "1s"),
        (1.2, "2s"),
        (59.0, "59s"),
        (60.0, "1m0s"),
        (360.0, "6m0s"),
        (361.0, "6m1s"),
        (3_600.0, "1h0m0s"),
        (3_723.0, "1h2m3s"),
    ],
)
def test_format_reset(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text
