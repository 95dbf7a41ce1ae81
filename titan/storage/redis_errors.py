"""One Titan error for an unreachable Redis: the stores' public methods raise
``StorageUnavailableError`` (503 ``storage_unavailable``) instead of redis-py's connection errors
and timeouts, so no caller sees a client library's exception (or answers 500 with it).

redis-py reconnects by itself: a pooled connection that failed is dropped, and the next call opens
a new one, so nothing here needs resetting when Redis returns.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.exceptions

from titan.errors import StorageUnavailableError

T = TypeVar("T", bound=type)

# Connection refused or reset, DNS, a full pool that timed out, a socket or command timeout, a
# replica still loading its data set: each passes when Redis (or the network) is back.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,  # includes redis-py's connection-pool errors
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    ConnectionError,  # OSError subclasses raised past redis-py
    TimeoutError,
)


def unavailable(exc: BaseException) -> StorageUnavailableError:
    error = StorageUnavailableError(
        f"The storage (Redis) is unreachable: {exc or type(exc).__name__}. Retry shortly."
    )
    error.__cause__ = exc
    return error


def _translating(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    return call


def translates_errors(cls: T) -> T:
    """Class decorator: each public coroutine method raises StorageUnavailableError for an
    unreachable Redis."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _translating(member))
    return cls
