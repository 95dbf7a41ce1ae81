"""Usage accounting: counters per scope, granularity and model; spend; reports; cost."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.clock import ManualClock
from titan.config.admission import Price
from titan.errors import InvalidRequestError
from titan.limits.usage import NAMESPACE, UsageLedger, cost_usd, period_of
from titan.storage.memory import MemoryCounters


def at(text: str) -> float:
    """Unix seconds of a UTC ``YYYY-MM-DD HH:MM:SS``."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


class TtlCounters(MemoryCounters):
    """Remembers the ttl of each increment."""

    def __init__(self, now: ManualClock) -> None:
        super().__init__(now=now)
        self.ttls: dict[str, float | None] = {}

    async def increment(self, namespace, counter_id, amounts, *, ttl_s=None):  # type: ignore[no-untyped-def]
        self.ttls[counter_id] = ttl_s
        await super().increment(namespace, counter_id, amounts, ttl_s=ttl_s)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(at("2026-11-29 17:30:00"))


@pytest.fixture
def counters(clock: ManualClock) -> TtlCounters:
    return TtlCounters(clock)


@pytest.fixture
def ledger(counters: TtlCounters, clock: ManualClock) -> UsageLedger:
    return UsageLedger(counters, now=clock)


async def record(ledger: UsageLedger, model: str = "smol", cost: float = 0.5, **scope) -> None:  # type: ignore[no-untyped-def]
    await ledger.record(
        key_id=scope.get("key_id", "0123456789ab"),
        tenant=scope.get("tenant", "acme"),
        model=model,
        prompt_tokens=10,
        completion_tokens=20,
        cost_usd=cost,
    )


def test_periods_are_utc_labels() -> None:
    now = at("2026-11-29 17:59:59")
    assert period_of("hour", now) == "2026-11-29T17"
    assert period_of("day", now) == "2026-11-29"
    assert period_of("month", now) == "2026-11"
    assert period_of("total", now) == "all"


async def test_record_counts_every_scope_granularity_and_model(
    ledger: UsageLedger, counters: TtlCounters
) -> None:
    await record(ledger)
    ids = [counter_id for counter_id, _ in await counters.scan(NAMESPACE)]
    assert len(ids) == 3 * 4 * 2
    expected = {"requests": 1, "prompt_tokens": 10, "completion_tokens": 20, "cost_usd": 0.5}
    for scope in ("key:0123456789ab", "tenant:acme", "all"):
        for granularity, period in [
            ("hour", "2026-11-29T17"),
            ("day", "2026-11-29"),
            ("month", "2026-11"),
            ("total", "all"),
        ]:
            for model in ("smol", "*"):
                counter_id = f"{scope}|{granularity}|{period}|{model}"
                assert await counters.read(NAMESPACE, counter_id) == expected
    ttls = {counter_id.split("|")[1]: ttl for counter_id, ttl in counters.ttls.items()}
    assert ttls == {"hour": 8 * 86_400, "day": 400 * 86_400, "month": None, "total": None}


async def test_anonymous_requests_count_only_in_all(
    ledger: UsageLedger, counters: TtlCounters
) -> None:
    await record(ledger, key_id=None, tenant=None)
    assert {cid.split("|")[0] for cid, _ in await counters.scan(NAMESPACE)} == {"all"}


async def test_scope_parts_with_a_separator_are_refused(ledger: UsageLedger) -> None:
    with pytest.raises(InvalidRequestError):
        await record(ledger, tenant="a|b")


async def test_spent_follows_the_calendar_across_boundaries(
    ledger: UsageLedger, clock: ManualClock
) -> None:
    clock.now = at("2026-11-30 23:59:59")
    await record(ledger, cost=1.0)
    await record(ledger, model="big", cost=2.0)
    assert await ledger.spent_usd("tenant:acme", "day") == pytest.approx(3.0)
    assert await ledger.spent_usd("key:0123456789ab", "month") == pytest.approx(3.0)
    clock.now = at("2026-12-01 00:00:00")  # a new day and a new month
    assert await ledger.spent_usd("tenant:acme", "day") == 0.0
    assert await ledger.spent_usd("tenant:acme", "month") == 0.0
    assert await ledger.spent_usd("tenant:acme", "total") == pytest.approx(3.0)
    await record(ledger, cost=0.25)
    assert await ledger.spent_usd("tenant:acme", "day") == pytest.approx(0.25)
    assert await ledger.spent_usd("all", "total") == pytest.approx(3.25)
    assert await ledger.spent_usd("tenant:nobody", "month") == 0.0


async def test_report_rows_per_period_and_model(ledger: UsageLedger, clock: ManualClock) -> None:
    clock.now = at("2026-11-29 17:10:00")
    await record(ledger)
    clock.now = at("2026-11-29 18:05:00")  # the next hour, same day
    await record(ledger)
    await record(ledger, model="big")
    await record(ledger, key_id="fedcba987654", tenant="globex")

    hours = await ledger.report("tenant:acme", "hour")
    assert [(r["period"], r["model"], r["requests"]) for r in hours] == [
        ("2026-11-29T17", "smol", 1),
        ("2026-11-29T18", "big", 1),
        ("2026-11-29T18", "smol", 1),
    ]
    assert hours[0] == {
        "scope": "tenant:acme",
        "period": "2026-11-29T17",
        "model": "smol",
        "requests": 1,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "cost_usd": 0.5,
    }
    days = await ledger.report("all", "day")
    assert [(r["model"], r["requests"]) for r in days] == [("big", 1), ("smol", 3)]
    assert (await ledger.report("all", "total"))[1]["prompt_tokens"] == 30

    every = await ledger.report(None, "month")
    assert [(r["scope"], r["model"], r["requests"]) for r in every] == [
        ("key:0123456789ab", "big", 1),
        ("key:0123456789ab", "smol", 2),
        ("key:fedcba987654", "smol", 1),
        ("tenant:acme", "big", 1),
        ("tenant:acme", "smol", 2),
        ("tenant:globex", "smol", 1),
    ]


async def test_report_range_keeps_the_periods_it_touches(
    ledger: UsageLedger, clock: ManualClock
) -> None:
    for when in ("2026-10-31 23:00:00", "2026-11-01 00:30:00", "2026-11-02 12:00:00"):
        clock.now = at(when)
        await record(ledger)
    days = await ledger.report("all", "day", at("2026-11-01 00:00:00"), at("2026-11-01 23:59:59"))
    assert [r["period"] for r in days] == ["2026-11-01"]
    hours = await ledger.report("all", "hour", start=at("2026-10-31 23:59:00"))
    assert [r["period"] for r in hours] == ["2026-10-31T23", "2026-11-01T00", "2026-11-02T12"]
    months = await ledger.report("all", "month", end=at("2026-10-31 23:59:59"))
    assert [(r["period"], r["requests"]) for r in months] == [("2026-10", 1)]
    totals = await ledger.report("all", "total", at("2030-01-01 00:00:00"), None)
    assert [(r["period"], r["requests"]) for r in totals] == [("all", 3)]


def test_cost() -> None:
    price = Price(prompt_per_1m=2.0, completion_per_1m=6.0)
    assert cost_usd(price, 1_000_000, 500_000) == pytest.approx(5.0)
    assert cost_usd(price, 0, 0) == 0.0
    assert cost_usd(None, 1000, 1000) == 0.0
