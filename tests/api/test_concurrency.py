"""The helpers that run n engine requests for one API request clean up after themselves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from titan.backends.concurrency import gather_all, merge
from titan.errors import InvalidRequestError


class Source:
    """An async stream that records whether it was closed before its end."""

    def __init__(self, items: list[int], delay_s: float = 0.0, fail_at: int | None = None):
        self.items, self.delay_s, self.fail_at = items, delay_s, fail_at
        self.is_closed_early = False

    async def stream(self) -> AsyncIterator[int]:
        index = 0
        try:
            for index, item in enumerate(self.items):
                await asyncio.sleep(self.delay_s)
                if index == self.fail_at:
                    raise InvalidRequestError("bad", param="x")
                yield item
            index = len(self.items)
        finally:
            self.is_closed_early = index < len(self.items)


async def test_merge_yields_everything_in_per_stream_order() -> None:
    sources = [Source([1, 2, 3], 0.001), Source([10, 20], 0.0015), Source([])]
    items = [pair async for pair in merge([source.stream() for source in sources])]
    assert sorted(items) == [(0, 1), (0, 2), (0, 3), (1, 10), (1, 20)]
    assert [item for index, item in items if index == 0] == [1, 2, 3]
    assert not any(source.is_closed_early for source in sources)


async def test_closing_merge_closes_every_source() -> None:
    sources = [Source(list(range(100)), 0.001) for _ in range(3)]
    merged = merge([source.stream() for source in sources])
    await anext(merged)
    await merged.aclose()
    assert all(source.is_closed_early for source in sources)


async def test_merge_error_closes_the_others_and_is_not_grouped() -> None:
    sources = [Source(list(range(100)), 0.001), Source([1, 2, 3], 0.001, fail_at=1)]
    with pytest.raises(InvalidRequestError):
        async for _ in merge([source.stream() for source in sources]):
            pass
    assert sources[0].is_closed_early


async def test_cancelling_a_merge_consumer_closes_sources() -> None:
    sources = [Source(list(range(1000)), 0.001) for _ in range(2)]

    async def consume() -> None:
        async for _ in merge([source.stream() for source in sources]):
            pass

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(source.is_closed_early for source in sources)


async def test_gather_all_first_error_cancels_the_rest() -> None:
    cancelled = asyncio.Event()

    async def slow() -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    async def failing() -> int:
        raise InvalidRequestError("bad", param="x")

    with pytest.raises(InvalidRequestError):
        await gather_all([slow(), failing()])
    assert cancelled.is_set()


async def test_gather_all_keeps_order() -> None:
    async def value(v: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return v

    assert await gather_all([value(1, 0.003), value(2, 0.0), value(3, 0.001)]) == [1, 2, 3]
