"""The usage buffer: sums in memory, one write per flush, nothing lost when a write fails."""

from __future__ import annotations

import pytest

from titan.limits.usage import NAMESPACE, Usage, UsageLedger
from titan.limits.usage_buffer import UsageBuffer
from titan.storage.memory import MemoryCounters

NOON = 1_764_417_600.0  # 2025-11-29T12:00:00Z


class Flaky(MemoryCounters):
    def __init__(self) -> None:
        super().__init__()
        self.num_failures_left = 0
        self.num_writes = 0

    async def increment_many(self, namespace, increments):  # type: ignore[no-untyped-def]
        if self.num_failures_left:
            self.num_failures_left -= 1
            raise ConnectionError("store down")
        self.num_writes += 1
        await super().increment_many(namespace, increments)


def used(tokens: int, key_id: str | None = "0123456789ab") -> Usage:
    return Usage(key_id, "acme", "m", tokens, 1, cost_usd=0.5)


async def test_requests_are_summed_and_written_once_per_flush_in_their_hour():
    store = Flaky()
    clock = [NOON + 10]
    buffer = UsageBuffer(UsageLedger(store, now=lambda: clock[0]), now=lambda: clock[0])
    for tokens in (10, 20, 30):
        buffer.add(used(tokens))
    buffer.add(used(5, key_id=None))
    assert await store.scan(NAMESPACE) == []  # nothing written before the flush
    clock[0] = NOON + 2 * 3600  # flushed later: still counted in the hour they happened
    await buffer.flush()
    assert store.num_writes == 1
    hour = await store.read(NAMESPACE, "key:0123456789ab|hour|2025-11-29T12|m")
    assert hour == {"requests": 3.0, "prompt_tokens": 60.0, "completion_tokens": 3.0,
                    "cost_usd": 1.5}  # fmt: skip
    total = await store.read(NAMESPACE, "all|total|all|*")
    assert total["requests"] == 4.0
    assert await buffer.ledger.spent_usd("tenant:acme", "total") == pytest.approx(2.0)


async def test_a_failed_write_keeps_the_sums_for_the_next_flush():
    store = Flaky()
    buffer = UsageBuffer(UsageLedger(store, now=lambda: NOON), now=lambda: NOON)
    buffer.add(used(10))
    store.num_failures_left = 1
    with pytest.raises(ConnectionError):
        await buffer.flush()
    buffer.add(used(10))
    await buffer.close()  # the last flush
    counted = await store.read(NAMESPACE, "all|day|2025-11-29|m")
    assert counted["requests"] == 2.0
    assert counted["prompt_tokens"] == 20.0
