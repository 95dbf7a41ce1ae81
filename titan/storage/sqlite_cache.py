"""Cached answers in the SQLite file (``CacheStore``), table ``cache_entries`` (schema in
``titan.storage.sqlite``). Each call is one transaction on the shared connection; calls that
write take the write lock up front (``BEGIN IMMEDIATE``), so another process opening the same
file cannot interleave with an eviction.

Failures fail open at the caller: a store that raises StorageUnavailableError (locked, full) is
a miss and stores nothing there; a lookup reads even while another process holds the write lock."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

import orjson

from titan.storage.base import CacheEntry
from titan.storage.sqlite import (
    SqliteDatabase,
    busy_timeout,
    is_write_refused,
    write_transaction,
)

COLUMNS = "key, value, embedding, tags, created_at, expires_at"
# A lookup waits this long at most for another process's write lock before it reads without
# marking the entry used: a cache lookup must not hold a request for the full busy timeout.
TOUCH_BUSY_TIMEOUT_S = 0.05


def _entry(row: tuple) -> CacheEntry:
    key, value, embedding, tags, created_at, expires_at = row
    return CacheEntry(
        key=key,
        value=bytes(value),
        created_at=created_at,
        expires_at=expires_at,
        tags=orjson.loads(tags),
        embedding=None if embedding is None else bytes(embedding),
    )


def _take(connection: sqlite3.Connection, namespace: str, where: str, args: tuple) -> list[str]:
    """Deletes the namespace's rows matching ``where``; returns their keys."""
    keys = [
        key
        for (key,) in connection.execute(
            f"SELECT key FROM cache_entries WHERE namespace = ? AND {where}", (namespace, *args)
        )
    ]
    connection.executemany(
        "DELETE FROM cache_entries WHERE namespace = ? AND key = ?",
        [(namespace, key) for key in keys],
    )
    return keys


class SqliteCache:
    """``now``: wall-clock unix seconds, since several processes compare the same expiries."""

    def __init__(self, db: SqliteDatabase, now: Callable[[], float] = time.time) -> None:
        self._db = db
        self._now = now

    async def get(self, namespace: str, key: str) -> CacheEntry | None:
        now = self._now()

        def get(connection: sqlite3.Connection) -> tuple | None:
            try:
                with busy_timeout(connection, TOUCH_BUSY_TIMEOUT_S):
                    return touch(connection)
            except sqlite3.Error as exc:
                if not is_write_refused(exc):
                    raise
                # Locked by another process, or full: the read still works (WAL), the LRU
                # mark and the lazy expiry wait for the next lookup.
                row = connection.execute(
                    f"SELECT {COLUMNS} FROM cache_entries WHERE namespace = ? AND key = ?",
                    (namespace, key),
                ).fetchone()
                return None if row is None or row[5] <= now else row

        def touch(connection: sqlite3.Connection) -> tuple | None:
            with write_transaction(connection):  # a hit writes: it marks the row recently used
                row = connection.execute(
                    f"SELECT {COLUMNS} FROM cache_entries WHERE namespace = ? AND key = ?",
                    (namespace, key),
                ).fetchone()
                if row is None:
                    return None
                if row[5] <= now:  # lazy expiry
                    connection.execute(
                        "DELETE FROM cache_entries WHERE namespace = ? AND key = ?",
                        (namespace, key),
                    )
                    return None
                connection.execute(
                    "UPDATE cache_entries SET last_used = ? WHERE namespace = ? AND key = ?",
                    (now, namespace, key),
                )
                return row

        row = await self._db.run(get)
        return None if row is None else _entry(row)

    async def put(self, namespace: str, entry: CacheEntry, *, max_entries: int) -> list[str]:
        now = self._now()
        tags = orjson.dumps(dict(entry.tags)).decode()
        row = (namespace, entry.key, entry.value, entry.embedding, tags)
        row += (entry.created_at, entry.expires_at, now, entry.num_bytes)

        def put(connection: sqlite3.Connection) -> list[str]:
            with write_transaction(connection):
                connection.execute(
                    "INSERT INTO cache_entries (namespace, key, value, embedding, tags, "
                    "created_at, expires_at, last_used, num_bytes) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, key) DO UPDATE "
                    "SET value = excluded.value, embedding = excluded.embedding, "
                    "tags = excluded.tags, created_at = excluded.created_at, "
                    "expires_at = excluded.expires_at, last_used = excluded.last_used, "
                    "num_bytes = excluded.num_bytes",
                    row,
                )
                # Expired rows go before live ones, and are reported too: a semantic index that
                # mirrors the store forgets them the same way.
                evicted = _take(connection, namespace, "expires_at <= ?", (now,))
                (count,) = connection.execute(
                    "SELECT count(*) FROM cache_entries WHERE namespace = ?", (namespace,)
                ).fetchone()
                if count > max_entries:
                    # Ties on last_used (the same clock tick) break by key, deterministically.
                    where = "key IN (SELECT key FROM cache_entries WHERE namespace = ? "
                    where += "ORDER BY last_used, key LIMIT ?)"
                    evicted += _take(connection, namespace, where, (namespace, count - max_entries))
                return evicted

        return await self._db.run(put)

    async def delete(self, namespace: str, key: str) -> bool:
        now = self._now()

        def delete(connection: sqlite3.Connection) -> bool:
            with write_transaction(connection):
                live = connection.execute(
                    "DELETE FROM cache_entries WHERE namespace = ? AND key = ? AND expires_at > ?",
                    (namespace, key, now),
                ).rowcount
                connection.execute(  # an expired row goes too, but was not an entry to delete
                    "DELETE FROM cache_entries WHERE namespace = ? AND key = ?", (namespace, key)
                )
                return live > 0

        return await self._db.run(delete)

    async def flush(
        self, namespace: str, *, tenant: str | None = None, model: str | None = None
    ) -> int:
        now = self._now()

        def flush(connection: sqlite3.Connection) -> int:
            with write_transaction(connection):
                # Expired rows go first, so only live entries are counted.
                connection.execute(
                    "DELETE FROM cache_entries WHERE namespace = ? AND expires_at <= ?",
                    (namespace, now),
                )
                return connection.execute(
                    "DELETE FROM cache_entries WHERE namespace = ? "
                    "AND (? IS NULL OR json_extract(tags, '$.tenant') = ?) "
                    "AND (? IS NULL OR json_extract(tags, '$.model') = ?)",
                    (namespace, tenant, tenant, model, model),
                ).rowcount

        return await self._db.run(flush)

    async def added_since(
        self, namespace: str, since: float, *, limit: int = 10_000
    ) -> list[CacheEntry]:
        now = self._now()

        def added_since(connection: sqlite3.Connection) -> list[tuple]:
            # Ties on created_at order by key, as in the other stores.
            return connection.execute(
                f"SELECT {COLUMNS} FROM cache_entries WHERE namespace = ? AND created_at > ? "
                "AND expires_at > ? ORDER BY created_at, key LIMIT ?",
                (namespace, since, now, limit),
            ).fetchall()

        return [_entry(row) for row in await self._db.run(added_since)]

    async def stats(self, namespace: str) -> dict[str, int]:
        now = self._now()

        def stats(connection: sqlite3.Connection) -> tuple[int, int]:
            return connection.execute(
                "SELECT count(*), coalesce(sum(num_bytes), 0) FROM cache_entries "
                "WHERE namespace = ? AND expires_at > ?",
                (namespace, now),
            ).fetchone()

        entries, num_bytes = await self._db.run(stats)
        return {"entries": entries, "bytes": num_bytes}
