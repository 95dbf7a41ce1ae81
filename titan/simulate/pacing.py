"""Sleeping a plan's timeline: tokens at their planned times, and the connection cut if planned."""

from __future__ import annotations

import asyncio

from titan.simulate.behaviour import RequestPlan


class ConnectionCut(Exception):
    """A connection-resetting outage began while the answer was under way."""


class Pacer:
    """Waits for each moment of a plan, measured from the pacer's creation (the arrival).

    Deadlines are absolute, so that the time spent sending chunks does not add up over a long
    stream. Cancelling a wait stops it at once: nothing else holds the request.
    """

    def __init__(self, plan: RequestPlan):
        self._plan = plan
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()

    async def until_token(self, token_index: int) -> None:
        """Returns when the token is due; raises ConnectionCut if the cut comes first."""
        await self._until(self._plan.token_s(token_index))

    async def until_finish(self) -> None:
        """Returns when the answer ends (a non-streaming answer is sent then)."""
        await self._until(self._plan.finish_s)

    async def _until(self, offset_s: float) -> None:
        cut_s = self._plan.cut_s
        if cut_s is not None and cut_s <= offset_s:
            await self._sleep_until(cut_s)
            raise ConnectionCut
        await self._sleep_until(offset_s)

    async def _sleep_until(self, offset_s: float) -> None:
        delay = self._start + offset_s - self._loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
