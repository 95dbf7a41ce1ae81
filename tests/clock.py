"""The one fake clock of the test suite: time moves only when a test says so."""

from __future__ import annotations

import asyncio


class ManualClock:
    """A ``now()`` callable for code that takes a clock; ``tick`` advances it on every read
    (for stores that need strictly increasing times)."""

    def __init__(self, now: float = 1_000.0, *, tick: float = 0.0) -> None:
        self.now = now
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """An ``asyncio.sleep`` stand-in that moves this clock instead of waiting."""
        self.now += seconds
        await asyncio.sleep(0)
