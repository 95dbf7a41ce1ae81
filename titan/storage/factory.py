"""``open_storage(url)``: the stores one ``storage:`` URL names."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from titan.config.summary import shown_url
from titan.errors import ConfigError, ServiceUnavailableError
from titan.storage.base import Storage
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits
from titan.storage.memory_cache import MemoryCache
from titan.storage.retained_documents import RetainedDocuments
from titan.storage.sealed import Keyring, SealedDocuments
from titan.storage.sealed_cache import SealedCache
from titan.storage.sealed_jobs import SealedJobs

if TYPE_CHECKING:
    from titan.config.data_at_rest import DataAtRestConfig

SCHEMES = "memory://, sqlite:///PATH (sqlite:///~/x.db, sqlite:////abs/x.db), redis://, rediss://"
REDIS_CONNECT_TIMEOUT_S = 5.0
# A command unanswered this long (a hung or partitioned Redis: no reset ever arrives) fails with
# StorageUnavailableError, which limits and the cache fail open on, instead of holding the request.
REDIS_COMMAND_TIMEOUT_S = 5.0
REDIS_MAX_CONNECTIONS = 64


async def open_storage(
    url: str,
    *,
    now: Callable[[], float] | None = None,
    key_prefix: str = "titan:",
    data_at_rest: DataAtRestConfig | None = None,
) -> Storage:
    """Opens ``url``: ``memory://`` (one process), ``sqlite:///PATH`` (durable documents and
    counters; limits in memory, since one process owns them) or ``redis://host:port/db`` /
    ``rediss://`` (everything, shared by replicas; keys start with ``key_prefix``).

    ``now`` is the memory stores' clock (tests inject one); SQLite and Redis keep their own.
    Cached answers expire by wall-clock time, so without ``now`` their memory store uses
    ``time.time``, not the monotonic clock of the limits.

    With ``data_at_rest`` (the server always passes it) documents and cached answers are sealed
    with its keys and documents expire by its retention, whatever the store: see
    ``titan.storage.sealed`` and ``titan.storage.retained_documents``.
    """
    storage = await _open(url, now, key_prefix)
    if data_at_rest is not None:
        protect(storage, data_at_rest, now or time.time)
    return storage


def protect(
    storage: Storage, data_at_rest: DataAtRestConfig, now: Callable[[], float] = time.time
) -> None:
    """Wraps the storage's documents, cache and jobs: sealed with the configured keys (none: written
    in clear, sealed data refused with a clear error), documents retained as configured."""
    keyring = Keyring(data_at_rest.key_bytes())
    storage.documents = SealedDocuments(storage.documents, keyring)
    retention_s = data_at_rest.retention.seconds_by_namespace()
    if retention_s:
        storage.retention = RetainedDocuments(storage.documents, retention_s, now)
        storage.documents = storage.retention
    if storage.cache is not None:
        storage.cache = SealedCache(storage.cache, keyring)
    if storage.jobs is not None:
        storage.jobs = SealedJobs(storage.jobs, keyring)


async def _open(url: str, now: Callable[[], float] | None, key_prefix: str) -> Storage:
    clock = now or time.monotonic
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        from titan.storage.sqlite import IN_MEMORY, SqliteDatabase
        from titan.storage.sqlite_jobs import SqliteJobQueue

        cache = MemoryCache(now or time.time)
        # The job queue's rules live in SQL: an in-memory database runs them for memory://.
        db = await SqliteDatabase.open(IN_MEMORY)
        return Storage(
            url, MemoryDocuments(), MemoryCounters(clock), MemoryLimits(clock), cache=cache,
            jobs=await SqliteJobQueue.open(db), closers=[db.close],
        )  # fmt: skip
    if scheme == "sqlite":
        return await _open_sqlite(url, clock)
    if scheme in ("redis", "rediss"):
        return await _open_redis(url, key_prefix)
    raise ConfigError(f"storage: unsupported URL {shown_url(url)!r}; use one of {SCHEMES}")


async def _open_sqlite(url: str, clock: Callable[[], float]) -> Storage:
    from titan.storage.sqlite import SqliteCounters, SqliteDatabase, SqliteDocuments
    from titan.storage.sqlite_cache import SqliteCache
    from titan.storage.sqlite_jobs import SqliteJobQueue

    # SQLAlchemy's convention: what follows ``sqlite:///`` is the path, so ``sqlite:///x.db`` is
    # relative, ``sqlite:////abs/x.db`` absolute and ``sqlite:///~/x.db`` under the home.
    head = "sqlite:///"
    path = url[len(head) :] if url.lower().startswith(head) else ""
    if not path:
        raise ConfigError(f"storage: {url!r} names no file; write sqlite:///PATH")
    try:
        db = await SqliteDatabase.open(path)
    except Exception as exc:  # sqlite3.Error, OSError (permissions, a directory in the way)
        raise ConfigError(f"storage: cannot open SQLite database {path!r}: {exc}") from exc
    return Storage(
        url,
        SqliteDocuments(db),
        SqliteCounters(db),
        MemoryLimits(clock),
        cache=SqliteCache(db),
        jobs=await SqliteJobQueue.open(db),
        closers=[db.close],
    )


async def _open_redis(url: str, key_prefix: str) -> Storage:
    # Imported here: a memory or SQLite deployment never loads the Redis client.
    import redis.asyncio
    import redis.exceptions

    from titan.storage.redis import RedisCounters, RedisDocuments, RedisLimits
    from titan.storage.redis_cache import RedisCache
    from titan.storage.redis_errors import UNAVAILABLE, unavailable
    from titan.storage.redis_jobs import RedisJobQueue

    try:
        # A blocking pool: a burst waits for a free connection instead of failing with
        # "Too many connections".
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=REDIS_MAX_CONNECTIONS,
            timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_COMMAND_TIMEOUT_S,
            health_check_interval=30,
        )
        client = redis.asyncio.Redis(connection_pool=pool)
    except ValueError as exc:
        raise ConfigError(f"storage: invalid Redis URL {shown_url(url)!r}: {exc}") from exc
    try:
        await client.ping()  # fail at start, not on the first request
    except (redis.exceptions.RedisError, OSError) as exc:
        await client.aclose()
        message = f"storage: cannot reach Redis at {shown_url(url)}: {exc}"
        raise ServiceUnavailableError(message) from exc

    async def ping() -> None:
        try:
            await client.ping()
        except UNAVAILABLE as exc:
            raise unavailable(exc) from exc

    return Storage(
        url,
        RedisDocuments(client, prefix=key_prefix),
        RedisCounters(client, prefix=key_prefix),
        RedisLimits(client, prefix=key_prefix),
        cache=RedisCache(client, prefix=key_prefix),
        jobs=RedisJobQueue(client, prefix=key_prefix),
        closers=[client.aclose, pool.disconnect],
        ping=ping,
    )
