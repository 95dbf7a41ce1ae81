"""One Titan error for a Redis that cannot serve: the stores' public methods raise
``StorageUnavailableError`` (503 ``storage_unavailable``) instead of redis-py's connection errors
and timeouts, so no caller sees a client library's exception (or answers 500 with it).

The same for a Redis that answers but refuses: out of memory under ``noeviction`` (OOM, 503
``storage_full``), a read-only replica (READONLY), a replica loading its data set (LOADING) or cut
from its primary (MASTERDOWN), a script running too long (BUSY), failed persistence (MISCONF),
too few replicas (NOREPLICAS), a cluster resharding or down. Each passes without Titan changing
anything, so the callers' fail-open/fail-closed policies apply as for an outage. Any other
``ResponseError`` (a bug: a wrong type, a bad argument) stays what it is.

redis-py reconnects by itself: a pooled connection that failed is dropped, and the next call opens
a new one, so nothing here needs resetting when Redis returns.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.exceptions

from titan.errors import StorageFullError, StorageUnavailableError

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

# Refusals redis-py has a class for (it strips the error code from their message).
_REFUSAL_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (redis.exceptions.ReadOnlyError, "is a read-only replica: writes need the primary (check "
     "that the storage URL names the primary, or wait for the failover to end)"),
    (redis.exceptions.MasterDownError, "is a replica cut off from its primary (MASTERDOWN)"),
    (redis.exceptions.TryAgainError, "is resharding (TRYAGAIN)"),
    (redis.exceptions.ClusterDownError, "cluster is down (CLUSTERDOWN)"),
)  # fmt: skip
# Refusals redis-py leaves as a plain ResponseError, the code first in the message.
_REFUSAL_CODES: dict[str, str] = {
    "BUSY": "is busy running a script (BUSY)",
    "MISCONF": "refuses writes: it cannot persist to disk (MISCONF); check its disk and logs",
    "NOREPLICAS": "refuses writes: too few replicas are connected (NOREPLICAS)",
    "MASTERDOWN": "is a replica cut off from its primary (MASTERDOWN)",
    "READONLY": "is a read-only replica (READONLY)",
    "LOADING": "is loading its data set into memory (LOADING)",
}


def unavailable(exc: BaseException) -> StorageUnavailableError:
    error = StorageUnavailableError(
        f"The storage (Redis) is unreachable: {exc or type(exc).__name__}. Retry shortly."
    )
    error.__cause__ = exc
    return error


def refused(exc: BaseException) -> StorageUnavailableError | None:
    """The Titan error for a Redis server-side refusal that passes by itself; None for the
    others (a ResponseError from a bug stays what it is)."""
    error: StorageUnavailableError | None = None
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        error = StorageFullError(
            f"The storage (Redis) is out of memory ({exc}): writes are refused until keys "
            "expire or are deleted. Raise its maxmemory or set an eviction policy; retry later."
        )
    for cls, state in _REFUSAL_CLASSES:
        if error is None and isinstance(exc, cls):
            error = StorageUnavailableError(f"The storage (Redis) {state}: {exc}. Retry shortly.")
    if error is None and isinstance(exc, redis.exceptions.ResponseError):
        code = str(exc).split(" ", 1)[0]
        if code in _REFUSAL_CODES:
            state = _REFUSAL_CODES[code]
            error = StorageUnavailableError(f"The storage (Redis) {state}: {exc}. Retry shortly.")
    if error is not None:
        error.__cause__ = exc
    return error


def _translating(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc
        except redis.exceptions.ResponseError as exc:
            error = refused(exc)
            if error is None:
                raise
            raise error from exc

    return call


def translates_errors(cls: T) -> T:
    """Class decorator: each public coroutine method raises StorageUnavailableError for an
    unreachable or refusing Redis."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _translating(member))
    return cls
