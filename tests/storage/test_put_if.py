"""``DocumentStore.put_if``: the same compare-and-set contract in every store, and exactly one
winner among concurrent writers expecting the same version."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from titan.storage.base import DocumentStore
from titan.storage.memory import MemoryDocuments
from titan.storage.redis import RedisDocuments
from titan.storage.sqlite import SqliteDatabase, SqliteDocuments


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def docs(request, tmp_path) -> AsyncIterator[DocumentStore]:
    if request.param == "memory":
        yield MemoryDocuments()
    elif request.param == "sqlite":
        db = await SqliteDatabase.open(tmp_path / "titan.db")
        yield SqliteDocuments(db)
        await db.close()
    else:
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        client = redis.asyncio.Redis.from_url(url)
        yield RedisDocuments(client, prefix=prefix)
        await client.aclose()


async def test_none_writes_only_when_absent(docs: DocumentStore) -> None:
    assert await docs.put_if("ns", "a", {"_version": "1", "x": 1}, expected=None)
    assert not await docs.put_if("ns", "a", {"_version": "2", "x": 2}, expected=None)
    assert await docs.get("ns", "a") == {"_version": "1", "x": 1}


async def test_writes_only_when_the_version_matches(docs: DocumentStore) -> None:
    assert not await docs.put_if("ns", "a", {"_version": "2"}, expected="1")  # absent
    assert await docs.get("ns", "a") is None
    await docs.put("ns", "a", {"_version": "1", "x": [1, None, {"y": "é"}]})
    assert not await docs.put_if("ns", "a", {"_version": "9"}, expected="2")
    assert await docs.put_if("ns", "a", {"_version": "2", "x": 2}, expected="1")
    assert await docs.get("ns", "a") == {"_version": "2", "x": 2}
    assert not await docs.put_if("ns", "a", {"_version": "3"}, expected="1")


async def test_a_document_without_a_string_version_matches_nothing(docs: DocumentStore) -> None:
    await docs.put("ns", "plain", {"x": 1})
    await docs.put("ns", "number", {"_version": 1})
    for doc_id in ("plain", "number"):
        assert not await docs.put_if("ns", doc_id, {"_version": "2"}, expected="1")
        assert not await docs.put_if("ns", doc_id, {"_version": "2"}, expected=None)
    # Other namespaces and ids are separate documents.
    assert await docs.put_if("other", "plain", {"_version": "1"}, expected=None)


async def test_after_delete_only_none_writes(docs: DocumentStore) -> None:
    await docs.put("ns", "a", {"_version": "1"})
    assert await docs.delete("ns", "a")
    assert not await docs.put_if("ns", "a", {"_version": "2"}, expected="1")
    assert await docs.put_if("ns", "a", {"_version": "2"}, expected=None)


async def test_concurrent_writers_exactly_one_wins(docs: DocumentStore) -> None:
    await docs.put("ns", "a", {"_version": "0"})
    results = await asyncio.gather(
        *(docs.put_if("ns", "a", {"_version": f"w{i}"}, expected="0") for i in range(20))
    )
    assert sum(results) == 1
    winner = results.index(True)
    assert await docs.get("ns", "a") == {"_version": f"w{winner}"}
    creators = await asyncio.gather(
        *(docs.put_if("ns", "new", {"_version": f"c{i}"}, expected=None) for i in range(20))
    )
    assert sum(creators) == 1


async def test_two_sqlite_connections_exactly_one_wins(tmp_path) -> None:
    # Two databases on one file: two processes' worth of connections.
    first = await SqliteDatabase.open(tmp_path / "t.db")
    second = await SqliteDatabase.open(tmp_path / "t.db")
    stores = [SqliteDocuments(first), SqliteDocuments(second)]
    await stores[0].put("ns", "a", {"_version": "0"})
    results = await asyncio.gather(
        *(stores[i % 2].put_if("ns", "a", {"_version": f"w{i}"}, expected="0") for i in range(10))
    )
    assert sum(results) == 1
    await first.close()
    await second.close()


@pytest.mark.redis
async def test_two_redis_clients_exactly_one_wins(redis_url, redis_prefix) -> None:
    clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(2)]
    stores = [RedisDocuments(client, prefix=redis_prefix) for client in clients]
    await stores[0].put("ns", "a", {"_version": "0"})
    results = await asyncio.gather(
        *(stores[i % 2].put_if("ns", "a", {"_version": f"w{i}"}, expected="0") for i in range(40))
    )
    assert sum(results) == 1
    for client in clients:
        await client.aclose()
