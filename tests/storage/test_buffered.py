"""Buffered counters: increments reach the store only when flushed, summed, and none is lost."""

from __future__ import annotations

import pytest

from titan.storage.base import Increment
from titan.storage.buffered import BufferedCounters
from titan.storage.memory import MemoryCounters


class FailingOnce(MemoryCounters):
    def __init__(self) -> None:
        super().__init__()
        self.num_failures_left = 1
        self.num_writes = 0

    async def increment_many(self, namespace, increments):  # type: ignore[no-untyped-def]
        if self.num_failures_left:
            self.num_failures_left -= 1
            raise ConnectionError("store down")
        self.num_writes += 1
        await super().increment_many(namespace, increments)


async def test_increments_are_summed_and_written_in_one_round_trip_per_flush():
    store = FailingOnce()
    store.num_failures_left = 0
    buffered = BufferedCounters(store)
    for _ in range(5):
        await buffered.increment("usage", "a", {"requests": 1, "tokens": 10}, ttl_s=60)
    await buffered.increment_many("usage", [Increment("b", {"requests": 2})])
    assert await store.read("usage", "a") == {}  # nothing written yet
    assert await buffered.read("usage", "a") == {"requests": 5.0, "tokens": 50.0}
    assert store.num_writes == 1
    assert await buffered.scan("usage") == [
        ("a", {"requests": 5.0, "tokens": 50.0}),
        ("b", {"requests": 2.0}),
    ]


async def test_a_failed_flush_keeps_the_counts_for_the_next_one():
    store = FailingOnce()
    buffered = BufferedCounters(store)
    await buffered.increment("usage", "a", {"requests": 1})
    with pytest.raises(ConnectionError):
        await buffered.flush()
    await buffered.increment("usage", "a", {"requests": 1})
    await buffered.close()  # the last flush
    assert await store.read("usage", "a") == {"requests": 2.0}
