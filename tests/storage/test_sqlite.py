"""SQLite documents and counters on a real file, including two openers of the same file (the CLI
writing keys while the server runs)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.clock import ManualClock
from titan.storage.sqlite import SqliteCounters, SqliteDatabase, SqliteDocuments


@pytest.fixture
async def db(tmp_path) -> AsyncIterator[SqliteDatabase]:
    db = await SqliteDatabase.open(tmp_path / "nested" / "titan.db")
    yield db
    await db.close()


async def test_documents(db):
    docs = SqliteDocuments(db)
    await docs.put("keys", "b", {"n": 2, "nested": {"x": [1, 2.5, None]}})
    await docs.put("keys", "a", {"n": 1})
    await docs.put("keys", "a", {"n": 11})  # put replaces
    await docs.put("other", "c", {})
    assert await docs.get("keys", "b") == {"n": 2, "nested": {"x": [1, 2.5, None]}}
    assert [i for i, _ in await docs.list("keys")] == ["a", "b"]
    assert (await docs.list("keys"))[0] == ("a", {"n": 11})
    assert await docs.delete("keys", "a") and not await docs.delete("keys", "a")
    assert await docs.get("keys", "a") is None and await docs.list("none") == []


async def test_counters_increment_read_scan_and_expire(db):
    clock = ManualClock(1_700_000_000.0)
    counters = SqliteCounters(db, now=clock)
    await counters.increment("usage", "k1:m", {"requests": 1, "tokens": 10})
    await counters.increment("usage", "k1:m", {"requests": 1, "usd": 0.25})
    await counters.increment("usage", "k2:m", {"requests": 3}, ttl_s=60)
    await counters.increment("usage", "k10:m", {"requests": 4})
    await counters.increment("other", "k1:m", {"requests": 100})
    assert await counters.read("usage", "k1:m") == {"requests": 2, "tokens": 10, "usd": 0.25}
    assert await counters.read("usage", "nope") == {}
    assert [i for i, _ in await counters.scan("usage")] == ["k10:m", "k1:m", "k2:m"]
    assert await counters.scan("usage", "k1:") == [
        ("k1:m", {"requests": 2, "tokens": 10, "usd": 0.25})
    ]
    assert await counters.scan("usage", "k%") == []  # a prefix, not a LIKE pattern
    clock.now += 30
    await counters.increment("usage", "k2:m", {"new": 1})  # joins the counter's expiry
    clock.now += 30
    assert await counters.read("usage", "k2:m") == {}
    assert await counters.scan("usage", "k2") == []
    await counters.increment("usage", "k2:m", {"requests": 1})
    assert await counters.read("usage", "k2:m") == {"requests": 1}  # restarted from zero


async def test_two_openers_of_one_file_see_each_others_writes(tmp_path):
    path = tmp_path / "shared.db"
    first, second = await SqliteDatabase.open(path), await SqliteDatabase.open(path)
    try:
        await SqliteDocuments(first).put("keys", "a", {"n": 1})
        assert await SqliteDocuments(second).get("keys", "a") == {"n": 1}
        await SqliteCounters(first).increment("usage", "a", {"requests": 1})
        await SqliteCounters(second).increment("usage", "a", {"requests": 2})
        assert await SqliteCounters(first).read("usage", "a") == {"requests": 3}
    finally:
        await first.close()
        await second.close()


async def test_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    db = await SqliteDatabase.open("~/deep/dir/titan.db")
    await db.close()
    assert (tmp_path / "deep" / "dir" / "titan.db").exists()
