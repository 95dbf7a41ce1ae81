"""Running several engine requests for one API request (``n > 1``, several prompts).

Both helpers keep one promise: when the caller goes away (cancelled, or the merged stream is
closed), every sub-request is cancelled and closed before control returns, which aborts it in the
engine. Errors come out as themselves, never wrapped in an ExceptionGroup, so that a 400 stays
a 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

T = TypeVar("T")


async def gather_all(coroutines: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently and return the results in order; the first error cancels the rest."""
    if len(coroutines) == 1:
        return [await coroutines[0]]
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_EXHAUSTED: Any = object()


async def _next(stream: AsyncIterator[T]) -> T:
    return await anext(stream, _EXHAUSTED)


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


@asynccontextmanager
async def closing_stream(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Like contextlib.aclosing, for any async iterator (aclose is called when it has one)."""
    try:
        yield stream
    finally:
        await _close(stream)


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Yield ``(index, item)`` from all streams as items arrive, until all are exhausted.

    The first error ends the merge and is raised. Items of one stream keep their order.
    """
    pending: dict[asyncio.Future[T], int] = {}
    try:
        if len(streams) == 1:  # the common case, without a task per item
            async for item in streams[0]:
                yield 0, item
            return
        for index, stream in enumerate(streams):
            pending[asyncio.ensure_future(_next(stream))] = index
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                index = pending.pop(future)
                item = future.result()
                if item is _EXHAUSTED:
                    continue
                pending[asyncio.ensure_future(_next(streams[index]))] = index
                yield index, item
    finally:
        # A stream cannot be closed while a pending __anext__ runs on it: cancel those first.
        for future in pending:
            future.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await _close(stream)
