"""Counters written in the background: increments add up in memory and reach the store in one
round trip per flush, so usage accounting costs the request path no I/O.

Reads flush first, so this replica always reads its own increments; another replica sees them
after at most one flush interval (and a crash loses at most that interval's counts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from titan.storage.base import CounterStore, Increment

logger = logging.getLogger("titan.storage")


class BufferedCounters:
    def __init__(self, store: CounterStore, *, flush_interval_s: float = 1.0):
        self.store = store
        self.flush_interval_s = flush_interval_s
        # (namespace, counter id) -> (summed amounts, the latest ttl asked for)
        self._pending: dict[tuple[str, str], tuple[dict[str, float], float | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def increment(
        self,
        namespace: str,
        counter_id: str,
        amounts: Mapping[str, float],
        *,
        ttl_s: float | None = None,
    ) -> None:
        summed, ttl = self._pending.get((namespace, counter_id), ({}, None))
        for name, amount in amounts.items():
            summed[name] = summed.get(name, 0.0) + float(amount)
        self._pending[(namespace, counter_id)] = (summed, ttl_s if ttl_s is not None else ttl)

    async def increment_many(self, namespace: str, increments: Sequence[Increment]) -> None:
        for item in increments:
            await self.increment(namespace, item.counter_id, item.amounts, ttl_s=item.ttl_s)

    async def read(self, namespace: str, counter_id: str) -> dict[str, float]:
        await self.flush()
        return await self.store.read(namespace, counter_id)

    async def scan(self, namespace: str, prefix: str = "") -> list[tuple[str, dict[str, float]]]:
        await self.flush()
        return await self.store.scan(namespace, prefix)

    async def flush(self) -> None:
        async with self._lock:  # one flush at a time keeps each increment written once
            pending, self._pending = self._pending, {}
            by_namespace: dict[str, list[Increment]] = {}
            for (namespace, counter_id), (amounts, ttl_s) in pending.items():
                by_namespace.setdefault(namespace, []).append(Increment(counter_id, amounts, ttl_s))
            try:
                for namespace, increments in list(by_namespace.items()):
                    await self.store.increment_many(namespace, increments)
                    del by_namespace[namespace]
            except BaseException:
                self._requeue(by_namespace)  # written at the next flush instead
                raise

    def _requeue(self, unwritten: dict[str, list[Increment]]) -> None:
        for namespace, increments in unwritten.items():
            for item in increments:
                summed, ttl = self._pending.get((namespace, item.counter_id), ({}, None))
                for name, amount in item.amounts.items():
                    summed[name] = summed.get(name, 0.0) + amount
                self._pending[(namespace, item.counter_id)] = (summed, item.ttl_s or ttl)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._flush_periodically())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                await self.flush()
            except Exception:  # the store is down: keep the counts, keep serving
                logger.exception("flushing usage counters failed; retrying at the next flush")
