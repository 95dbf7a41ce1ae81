"""Usage summed in memory and written in the background, so accounting costs a request a dict
update instead of store round trips.

Requests add up per (key, tenant, model, UTC hour); a flush expands each sum into the ledger's
counters in one round trip. Reads of spend flush first, so this replica always sees its own usage;
another replica sees it within one flush interval, and a crash loses at most that interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from titan.limits.usage import Usage, UsageLedger

logger = logging.getLogger("titan.usage")

HOUR_S = 3600.0

_Group = tuple[str | None, str | None, str, float]  # key id, tenant, model, hour start


class UsageBuffer:
    def __init__(
        self,
        ledger: UsageLedger,
        *,
        flush_interval_s: float = 1.0,
        now: Callable[[], float] = time.time,
        on_error: Callable[[Exception], None] | None = None,
    ):
        self.ledger = ledger
        self.flush_interval_s = flush_interval_s
        self._now = now
        self._on_error = on_error
        self._is_failing = False
        self._pending: dict[_Group, Usage] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def add(self, usage: Usage) -> None:
        hour = self._now() // HOUR_S * HOUR_S
        group = (usage.key_id, usage.tenant, usage.model, hour)
        summed = self._pending.get(group)
        self._pending[group] = usage if summed is None else _sum(summed, usage)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    async def flush(self) -> None:
        async with self._lock:  # one flush at a time: each sum is written once
            pending, self._pending = self._pending, {}
            if not pending:
                return
            try:
                # Each sum is counted at its hour's start: the same hour, day and month.
                await self.ledger.record_many([(g[3], u) for g, u in pending.items()])
            except BaseException:
                for group, usage in pending.items():  # written by the next flush instead
                    later = self._pending.get(group)
                    self._pending[group] = usage if later is None else _sum(usage, later)
                raise

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
            except Exception as exc:  # the store is down: keep the sums, keep serving
                if self._on_error is not None:
                    self._on_error(exc)
                if not self._is_failing:  # one line per outage
                    logger.exception("writing usage failed; retrying at every flush")
                self._is_failing = True
                continue
            if self._is_failing:
                logger.info("writing usage works again")
                self._is_failing = False

    @property
    def num_pending(self) -> int:
        """Sums not yet written (one per key, tenant, model and hour: bounded)."""
        return len(self._pending)


def _sum(a: Usage, b: Usage) -> Usage:
    return replace(
        a,
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cost_usd=a.cost_usd + b.cost_usd,
        requests=a.requests + b.requests,
    )
