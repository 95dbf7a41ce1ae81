"""SQLite locked by another process, and full: real locks (a second connection holding
``BEGIN EXCLUSIVE``) and a real SQLITE_FULL (``PRAGMA max_page_count``), first on the stores, then
through a real uvicorn-served app — 503s with OpenAI error bodies, never a 500; reads keep
working; the cache fails open; nothing answered as stored is missing; recovery once released."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest

from tests.integration.harness import running_titan
from titan.config import config_from_mapping
from titan.errors import StorageFullError, StorageUnavailableError
from titan.service.pipeline import Pipeline
from titan.storage.base import CacheEntry, Job, Storage
from titan.storage.memory import MemoryLimits
from titan.storage.sqlite import SqliteCounters, SqliteDatabase, SqliteDocuments, storage_error
from titan.storage.sqlite_cache import SqliteCache
from titan.storage.sqlite_jobs import SqliteJobQueue

SHORT_BUSY_S = 0.2  # the tests' busy timeout: a locked write gives up this fast


@pytest.fixture
async def db(tmp_path) -> AsyncIterator[SqliteDatabase]:
    db = await SqliteDatabase.open(tmp_path / "titan.db", busy_timeout_s=SHORT_BUSY_S)
    yield db
    await db.close()


@contextmanager
def write_locked(path: str) -> Iterator[None]:
    """Another process's write lock on the file (a second connection, as another process has)."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


async def set_max_pages(db: SqliteDatabase, extra_pages: int | None) -> None:
    """Caps the file at its current size plus ``extra_pages`` (None: lifts the cap)."""

    def cap(connection: sqlite3.Connection) -> None:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        limit = 2**31 - 2 if extra_pages is None else pages + extra_pages
        connection.execute(f"PRAGMA max_page_count = {limit}")

    await db.run(cap)


def job(job_id: str, payload: str = "") -> Job:
    return Job(id=job_id, tenant="acme", payload={"text": payload}, created_at=time.time())


def entry(key: str, value: bytes = b"answer") -> CacheEntry:
    now = time.time()
    return CacheEntry(key=key, value=value, created_at=now, expires_at=now + 60, tags={})


async def test_a_write_lock_held_past_the_busy_timeout_is_a_clear_503(db):
    docs, counters, cache = SqliteDocuments(db), SqliteCounters(db), SqliteCache(db)
    jobs = await SqliteJobQueue.open(db)
    await docs.put("files", "a", {"n": 1})
    await cache.put("exact", entry("k"), max_entries=10)
    with write_locked(db.path):
        started = time.monotonic()
        with pytest.raises(StorageUnavailableError) as refused:
            await docs.put("files", "b", {"n": 2})
        assert time.monotonic() - started < SHORT_BUSY_S + 2  # waited the busy timeout, no more
        assert refused.value.code == "storage_unavailable" and refused.value.status_code == 503
        assert refused.value.retry_after and "locked" in refused.value.message
        assert db.path not in refused.value.message  # clients read it: no server paths
        assert not isinstance(refused.value, StorageFullError)
        with pytest.raises(StorageUnavailableError):
            await jobs.submit([job("j1")])
        with pytest.raises(StorageUnavailableError):
            await counters.increment("usage", "acme", {"tokens": 5})
        # Reads keep working beside another process's write lock (WAL), the cache's too.
        assert await docs.get("files", "a") == {"n": 1}
        assert (await cache.get("exact", "k")).value == b"answer"  # type: ignore[union-attr]
        assert await jobs.get("acme", "j1") is None  # refused means not stored
    # Released: the same connection writes again (no transaction was left open).
    await docs.put("files", "b", {"n": 2})
    assert [j.id for j in await jobs.submit([job("j1")])] == ["j1"]
    assert await docs.get("files", "b") == {"n": 2}


async def test_a_full_database_is_storage_full_and_nothing_is_half_stored(db):
    docs, cache = SqliteDocuments(db), SqliteCache(db)
    jobs = await SqliteJobQueue.open(db)
    await docs.put("files", "small", {"n": 1})
    await cache.put("exact", entry("k"), max_entries=10)
    await set_max_pages(db, 0)
    big = "x" * 200_000
    with pytest.raises(StorageFullError) as full:
        await docs.put("files", "big", {"text": big})
    assert full.value.status_code == 503 and full.value.code == "storage_full"
    assert "full" in full.value.message and "free" in full.value.message.lower()
    assert isinstance(full.value, StorageUnavailableError)  # fail-open callers treat it alike
    # A batch of jobs that does not fit is refused whole: none of them half-stored.
    with pytest.raises(StorageFullError):
        await jobs.submit([job(f"j{i}", big) for i in range(5)])
    assert await jobs.counts("acme") == {}
    with pytest.raises(StorageFullError):
        await cache.put("exact", entry("big", big.encode()), max_entries=10)
    assert await docs.get("files", "small") == {"n": 1}
    assert await docs.get("files", "big") is None
    assert (await cache.get("exact", "k")).value == b"answer"  # type: ignore[union-attr]
    await set_max_pages(db, None)  # space freed
    await docs.put("files", "big", {"text": big})
    assert len(await jobs.submit([job(f"j{i}", big) for i in range(5)])) == 5
    assert (await docs.get("files", "big")) == {"text": big}


def test_which_failures_become_storage_errors():
    full = storage_error(OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(full, StorageFullError)
    assert storage_error(OSError(errno.EACCES, "denied")) is None
    assert isinstance(storage_error(sqlite3.OperationalError("disk I/O error")),
                      StorageUnavailableError)  # fmt: skip
    # A bug (bad SQL, a broken constraint) stays what it is: not a storage outage.
    assert storage_error(sqlite3.IntegrityError("UNIQUE constraint failed")) is None
    assert storage_error(sqlite3.OperationalError("no such table: x")) is None


# ---- through a real server ---------------------------------------------------------------------

CONFIG = {
    "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
    "probes": {"enabled": False},
    "jobs": {"poll_s": 0.05},
}
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}


async def sqlite_storage(db: SqliteDatabase) -> Storage:
    return Storage(f"sqlite:///{db.path}", SqliteDocuments(db), SqliteCounters(db),
                   MemoryLimits(time.monotonic), cache=SqliteCache(db),
                   jobs=await SqliteJobQueue.open(db), closers=[db.close])  # fmt: skip


@contextmanager
def serving(storage: Storage) -> Iterator[str]:
    """A real uvicorn serving Titan on ``storage``; yields its base URL once ready."""
    config = config_from_mapping(CONFIG, "test config")
    with running_titan(config, pipeline=Pipeline(config, storage=storage)) as base_url:
        yield base_url


def upload(client: httpx.Client, name: str, size: int = 100) -> httpx.Response:
    line = b'{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    data = line * max(1, size // len(line))
    return client.post("/v1/files", files={"file": (name, data)}, data={"purpose": "batch"})


def assert_error(response: httpx.Response, code: str) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "service_unavailable"
    assert error["message"] and float(response.headers["retry-after"]) > 0


def ask(base_url: str, question: str):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0) as client:
        return client.chat.completions.with_raw_response.create(
            model="sim", messages=[{"role": "user", "content": question}], temperature=0
        )


@pytest.mark.slow
def test_a_server_on_a_locked_then_full_sqlite_file_answers_503s_and_recovers(tmp_path):
    db = asyncio.run(SqliteDatabase.open(tmp_path / "titan.db", busy_timeout_s=SHORT_BUSY_S))
    storage = asyncio.run(sqlite_storage(db))
    with serving(storage) as titan, httpx.Client(base_url=titan, timeout=30) as client:
        kept = upload(client, "kept.jsonl")
        assert kept.status_code == 200, kept.text
        kept_id = kept.json()["id"]

        with write_locked(db.path):
            assert_error(upload(client, "locked.jsonl"), "storage_unavailable")
            submitted = client.post("/v1/jobs", json={"endpoint": "/v1/chat/completions",
                                                      "body": CHAT})  # fmt: skip
            assert_error(submitted, "storage_unavailable")  # not a 202 for a job not stored
            assert client.get(f"/v1/files/{kept_id}").status_code == 200  # reads still work
            # The cache fails open: the answer comes from the model, not a 5xx.
            assert ask(titan, "locked?").headers["x-titan-cache"] == "miss"

        asyncio.run(set_max_pages(db, 0))
        assert_error(upload(client, "full.jsonl", size=300_000), "storage_full")
        assert client.get(f"/v1/files/{kept_id}").status_code == 200
        answered = ask(titan, "full?")
        assert answered.http_response.status_code == 200
        # Every file the server said it stored is listed; the refused ones are not.
        names = [f["filename"] for f in client.get("/v1/files").json()["data"]]
        assert names == ["kept.jsonl"]

        asyncio.run(set_max_pages(db, None))  # room again: everything works, no restart
        assert upload(client, "after.jsonl", size=300_000).status_code == 200
        job = client.post("/v1/jobs", json={"endpoint": "/v1/chat/completions", "body": CHAT})
        assert job.status_code == 202, job.text
        ask(titan, "cached now")
        for _ in range(50):  # the answer is stored in the background
            if ask(titan, "cached now").headers["x-titan-cache"] == "hit-exact":
                break
            time.sleep(0.05)
        else:
            pytest.fail("the cache did not store an answer after the lock was released")
    asyncio.run(db.close())
