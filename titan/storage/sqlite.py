"""Durable documents, counters and cached answers in one SQLite file (WAL).

sqlite3 blocks, so every call runs in a worker thread; one lock serializes the connection (it is
shared by threads: ``check_same_thread=False``). Other processes may open the same file (``titan
keys create`` while ``titan serve`` runs): WAL lets readers run beside a writer, writes take the
lock with ``BEGIN IMMEDIATE`` and wait up to the busy timeout for another process's write.

SQLite's own failures never reach a caller as ``sqlite3`` exceptions: a write lock held past the
busy timeout, an I/O error or a read-only file become ``StorageUnavailableError`` (503
``storage_unavailable``), a full disk or database ``StorageFullError`` (503 ``storage_full``),
so the callers' fail-open/fail-closed policies apply as for an unreachable Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson

from titan.errors import StorageFullError, StorageUnavailableError
from titan.storage.base import Increment, version_matches

T = TypeVar("T")

BUSY_TIMEOUT_S = 5.0
IN_MEMORY = ":memory:"
# SQLite's primary result codes (the low byte of ``sqlite3.Error.sqlite_errorcode``).
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL = 5, 6, 8, 10, 13

SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (namespace, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    field TEXT NOT NULL,
    value REAL NOT NULL,
    expires_at REAL,
    PRIMARY KEY (namespace, id, field)
) WITHOUT ROWID;
-- A rowid table (unlike the two above): its rows hold answers and embeddings, large blobs that
-- WITHOUT ROWID tables store poorly. The expiry index lets put drop expired rows without a scan.
CREATE TABLE IF NOT EXISTS cache_entries (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    embedding BLOB,
    tags TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    last_used REAL NOT NULL,
    num_bytes INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX IF NOT EXISTS cache_entries_lru ON cache_entries (namespace, last_used);
CREATE INDEX IF NOT EXISTS cache_entries_created ON cache_entries (namespace, created_at);
CREATE INDEX IF NOT EXISTS cache_entries_expiry ON cache_entries (namespace, expires_at);
"""


class SqliteDatabase:
    """One connection to one file, shared by ``SqliteDocuments`` and ``SqliteCounters``."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        path: str = IN_MEMORY,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
    ) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self.path = path
        self.busy_timeout_s = busy_timeout_s

    @classmethod
    async def open(
        cls, path: str | Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S
    ) -> SqliteDatabase:
        """Opens (creating the file, its directory and the tables) ``path``; ``~`` is expanded.
        A write waits up to ``busy_timeout_s`` for another process's write lock, then fails
        with StorageUnavailableError."""
        return await asyncio.to_thread(cls._open_sync, str(path), busy_timeout_s)

    @classmethod
    def _open_sync(cls, path: str, busy_timeout_s: float) -> SqliteDatabase:
        if path != IN_MEMORY:
            file = Path(path).expanduser()
            file.parent.mkdir(parents=True, exist_ok=True)
            path = str(file)
        # isolation_level=None: no implicit transactions; writes say BEGIN IMMEDIATE themselves.
        connection = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")  # durable across crashes under WAL
            connection.executescript(SCHEMA)
        except BaseException:
            connection.close()
            raise
        return cls(connection, path, busy_timeout_s)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``work(connection)`` in a thread, alone on the connection. A lock held too long,
        a full disk or an I/O error raises a StorageUnavailableError (see ``storage_error``)."""

        def locked() -> T:
            with self._lock:
                try:
                    return work(self._connection)
                except (sqlite3.Error, OSError) as exc:
                    # Never leave a half-done transaction open: the next call would fail with
                    # "cannot start a transaction within a transaction" forever after.
                    _roll_back(self._connection)
                    error = storage_error(exc, self.busy_timeout_s)
                    if error is None:
                        raise
                    raise error from exc

        return await asyncio.to_thread(locked)

    async def close(self) -> None:
        await self.run(lambda connection: connection.close())


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_write_refused(exc: BaseException) -> bool:
    """Another process holds the write lock, or there is no room to write: reads still work."""
    if not isinstance(exc, sqlite3.Error):
        return False
    text = str(exc).lower()
    return _primary_code(exc) in (SQLITE_BUSY, SQLITE_LOCKED, SQLITE_FULL) or any(
        phrase in text for phrase in ("locked", "busy", "is full")
    )


def storage_error(
    exc: BaseException, busy_timeout_s: float = BUSY_TIMEOUT_S
) -> StorageUnavailableError | None:
    """The Titan error for SQLite's failure ``exc``; None for the others (a bug in a statement,
    a constraint): those stay what they are. Clients read the message: it names no path."""
    where = "The storage (SQLite)"
    if isinstance(exc, OSError) and not isinstance(exc, sqlite3.Error):
        if exc.errno == errno.ENOSPC:
            return StorageFullError(f"{where} cannot write: no space left on the device. Free "
                                    "disk space; reads keep working meanwhile.")  # fmt: skip
        return None
    if not isinstance(exc, sqlite3.Error):
        return None
    code, text = _primary_code(exc), str(exc).lower()
    if code == SQLITE_FULL or "is full" in text:
        return StorageFullError(
            f"{where} is full ({exc}): nothing more can be stored until disk space is freed (or "
            "the database's size limit raised). Reads keep working; retry once there is room."
        )
    if code in (SQLITE_BUSY, SQLITE_LOCKED) or "locked" in text or "busy" in text:
        return StorageUnavailableError(
            f"{where} is locked: another process has held its write lock for more than "
            f"{busy_timeout_s:g} s ({exc}). Retry shortly; if it lasts, stop the process that "
            "holds the file open for writing (a long `titan` command, a backup, an editor)."
        )
    if code == SQLITE_READONLY or "readonly" in text:
        return StorageUnavailableError(f"{where} cannot be written ({exc}): check the file's "
                                       "and its directory's permissions.")  # fmt: skip
    if code == SQLITE_IOERR or "disk i/o error" in text:
        return StorageUnavailableError(f"{where} failed to read or write the disk ({exc}). "
                                       "Retry shortly; check the volume if it lasts.")  # fmt: skip
    return None


def _roll_back(connection: sqlite3.Connection) -> None:
    # SQLite rolls some failed transactions back by itself (SQLITE_FULL may): only roll back an
    # open one, and let a failing ROLLBACK not hide the error that caused it.
    if connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")


@contextmanager
def write_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, so a read-then-write cannot be interleaved by
    # another process's write (and waits on the busy timeout instead of failing mid-way).
    # COMMIT is inside the try: a commit refused (disk full, busy) must not leave it open.
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        _roll_back(connection)
        raise


@contextmanager
def busy_timeout(connection: sqlite3.Connection, seconds: float) -> Iterator[None]:
    """A shorter wait for another process's write lock, for writes that may be skipped (the
    cache's recently-used mark): they give up quickly instead of holding the request."""
    (previous_ms,) = connection.execute("PRAGMA busy_timeout").fetchone()
    connection.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    try:
        yield
    finally:
        connection.execute(f"PRAGMA busy_timeout = {int(previous_ms)}")


class SqliteDocuments:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def put(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> None:
        text = orjson.dumps(doc).decode()

        def put(connection: sqlite3.Connection) -> None:
            connection.execute(
                "INSERT INTO documents (namespace, id, doc) VALUES (?, ?, ?) "
                "ON CONFLICT (namespace, id) DO UPDATE SET doc = excluded.doc",
                (namespace, doc_id, text),
            )

        await self._db.run(put)

    async def put_if(
        self, namespace: str, doc_id: str, doc: Mapping[str, Any], *, expected: str | None
    ) -> bool:
        text = orjson.dumps(doc).decode()

        def put_if(connection: sqlite3.Connection) -> bool:
            # One IMMEDIATE transaction: no other writer (thread or process) between the read
            # and the write.
            with write_transaction(connection):
                row = connection.execute(
                    "SELECT doc FROM documents WHERE namespace = ? AND id = ?", (namespace, doc_id)
                ).fetchone()
                current = None if row is None else orjson.loads(row[0])
                if not version_matches(current, expected):
                    return False
                connection.execute(
                    "INSERT INTO documents (namespace, id, doc) VALUES (?, ?, ?) "
                    "ON CONFLICT (namespace, id) DO UPDATE SET doc = excluded.doc",
                    (namespace, doc_id, text),
                )
                return True

        return await self._db.run(put_if)

    async def get(self, namespace: str, doc_id: str) -> dict[str, Any] | None:
        def get(connection: sqlite3.Connection) -> str | None:
            row = connection.execute(
                "SELECT doc FROM documents WHERE namespace = ? AND id = ?", (namespace, doc_id)
            ).fetchone()
            return None if row is None else row[0]

        text = await self._db.run(get)
        return None if text is None else orjson.loads(text)

    async def delete(self, namespace: str, doc_id: str) -> bool:
        def delete(connection: sqlite3.Connection) -> bool:
            cursor = connection.execute(
                "DELETE FROM documents WHERE namespace = ? AND id = ?", (namespace, doc_id)
            )
            return cursor.rowcount > 0

        return await self._db.run(delete)

    async def list(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        def list_(connection: sqlite3.Connection) -> list[tuple[str, str]]:
            # BINARY collation compares UTF-8 bytes: the same order as Python's sorted(str).
            return connection.execute(
                "SELECT id, doc FROM documents WHERE namespace = ? ORDER BY id", (namespace,)
            ).fetchall()

        rows = await self._db.run(list_)
        return [(doc_id, orjson.loads(text)) for doc_id, text in rows]


class SqliteCounters:
    """One row per (namespace, id, field). ``ttl_s`` (re)sets the expiry of all the counter's
    rows, and new fields join the counter's current expiry (as fields of a Redis hash do).
    ``now`` is wall-clock time because several processes compare the same expiry."""

    def __init__(self, db: SqliteDatabase, now: Callable[[], float] = time.time) -> None:
        self._db = db
        self._now = now

    async def increment(
        self,
        namespace: str,
        counter_id: str,
        amounts: Mapping[str, float],
        *,
        ttl_s: float | None = None,
    ) -> None:
        await self.increment_many(namespace, [Increment(counter_id, amounts, ttl_s)])

    async def increment_many(self, namespace: str, increments: Sequence[Increment]) -> None:
        now = self._now()

        def increment(connection: sqlite3.Connection) -> None:
            with write_transaction(connection):  # one transaction for them all
                for item in increments:
                    _increment_one(connection, namespace, item, now)

        await self._db.run(increment)

    async def read(self, namespace: str, counter_id: str) -> dict[str, float]:
        now = self._now()

        def read(connection: sqlite3.Connection) -> list[tuple[str, float]]:
            return connection.execute(
                "SELECT field, value FROM counters WHERE namespace = ? AND id = ? "
                "AND (expires_at IS NULL OR expires_at > ?)",
                (namespace, counter_id, now),
            ).fetchall()

        return dict(await self._db.run(read))

    async def scan(self, namespace: str, prefix: str = "") -> list[tuple[str, dict[str, float]]]:
        now = self._now()

        def scan(connection: sqlite3.Connection) -> list[tuple[str, str, float]]:
            with write_transaction(connection):
                # The lazy sweep: a namespace's expired counters are deleted when it is scanned.
                connection.execute(
                    "DELETE FROM counters WHERE namespace = ? AND expires_at <= ?",
                    (namespace, now),
                )
                return connection.execute(
                    "SELECT id, field, value FROM counters WHERE namespace = ? "
                    "AND substr(id, 1, ?) = ? ORDER BY id, field",
                    (namespace, len(prefix), prefix),
                ).fetchall()

        found: dict[str, dict[str, float]] = {}
        for counter_id, name, value in await self._db.run(scan):
            found.setdefault(counter_id, {})[name] = value
        return list(found.items())


def _increment_one(
    connection: sqlite3.Connection, namespace: str, item: Increment, now: float
) -> None:
    key = (namespace, item.counter_id)
    # Expired rows go first, so the counter restarts from zero.
    connection.execute(
        "DELETE FROM counters WHERE namespace = ? AND id = ? AND expires_at <= ?", (*key, now)
    )
    if item.ttl_s is not None:
        expires_at = now + item.ttl_s
    else:
        row = connection.execute(
            "SELECT max(expires_at) FROM counters WHERE namespace = ? AND id = ?", key
        ).fetchone()
        expires_at = row[0]
    connection.executemany(
        "INSERT INTO counters (namespace, id, field, value, expires_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, id, field) "
        "DO UPDATE SET value = value + excluded.value",
        [(*key, name, float(amount), expires_at) for name, amount in item.amounts.items()],
    )
    if item.ttl_s is not None:
        connection.execute(
            "UPDATE counters SET expires_at = ? WHERE namespace = ? AND id = ?",
            (expires_at, *key),
        )
