"""Stream helpers for the pipeline: nothing here knows about HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def close_stream(stream: AsyncIterator[T]) -> None:
    """Close an async iterator early (``aclose`` when it has one), which ends its work."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def _chain(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await close_stream(rest)


async def _empty() -> AsyncIterator[T]:
    return
    yield  # an async generator that yields nothing


async def start_stream(stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """Pull the first item now, so that errors raised before any output (bad parameter, prompt
    too long, model not ready) surface here, while the caller can still answer with a status
    code. Returns a stream that yields that item and then the rest; closing it closes ``stream``.
    """
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        return _empty()
    except BaseException:
        await close_stream(stream)
        raise
    return _chain(first, stream)
