"""A delete removes the data from every place it was stored, on every replica: two Titan replicas
share one Redis (data sealed at rest), objects are written and read through both with the openai
SDK, deleted through one, and then looked for through the other and in Redis's raw keys.

Vector search uses a word-count embedder in place of MiniLM (the test is about where data goes,
not about ranking), so no model loads."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.context.test_rag import WordEmbedder
from tests.integration import harness
from tests.integration.test_admission import MASTER, create_key
from titan.cache.embedder import Embedder

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SWEEP_S = 0.2
HANDBOOK = b"Adoption leave lasts sixteen weeks. Remote work is allowed three days a week."
SECRET = "the launch code is swordfish"


def replica_config(storage: str, data_key: str) -> dict:
    simulated = {"backend": "simulated", "profile": {"ttft_s": 0.001, "output_tokens": 4}}
    return {
        "models": [{"name": "sim", "deployments": [simulated]}],
        "probes": {"enabled": False},
        "storage": storage,
        "auth": {"master_key": MASTER, "key_cache_s": 0},
        "cache": {"exact": True},
        "data_at_rest": {"encryption_keys": [data_key], "sweep_interval_s": SWEEP_S},
    }


@pytest.fixture
def replicas(shared_redis: str, monkeypatch: pytest.MonkeyPatch):
    """Two replicas (base URLs) and their apps, to look into a replica's in-memory index."""
    monkeypatch.setattr(Embedder, "load", classmethod(lambda cls: WordEmbedder()))
    apps: list[Any] = []

    def create_app(config):
        apps.append(original(config))
        return apps[-1]

    original = harness.create_app
    monkeypatch.setattr(harness, "create_app", create_app)
    data_key = base64.b64encode(os.urandom(32)).decode()
    config = replica_config(shared_redis, data_key)
    with harness.running_titan(config) as a, harness.running_titan(config) as b:
        yield a, b, apps[1].state.titan.pipeline


@pytest.fixture
def sdk() -> Iterator[Callable[[str, str], openai.OpenAI]]:
    """Makes SDK clients, closed at the end (an unclosed pool's sockets fail a later test)."""
    made: list[openai.OpenAI] = []

    def make(base_url: str, key: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0))
        return made[-1]

    yield make
    for client in made:
        client.close()


def eventually(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.05)
    return value


def raw_redis(url: str) -> bytes:
    """Every key and value Titan holds in Redis, as one blob to search."""
    client = redis.Redis.from_url(url)
    try:
        blob = []
        for key in client.scan_iter(match="titan:*"):
            blob.append(key)
            if client.type(key) == b"hash":
                blob += [k + b"=" + v for k, v in client.hgetall(key).items()]
        return b"\n".join(blob)
    finally:
        client.close()


def test_files_and_vector_stores_deleted_on_one_replica_are_gone_from_the_other(
    replicas, shared_redis, sdk
):
    a, b, pipeline_b = replicas
    key = create_key(a)
    on_a, on_b = sdk(a, key), sdk(b, key)
    handbook = on_a.files.create(file=("handbook.txt", HANDBOOK), purpose="assistants")
    first = on_a.vector_stores.create(name="first", file_ids=[handbook.id])
    second = on_a.vector_stores.create(name="second", file_ids=[handbook.id])
    for store in (first, second):  # B's index loads both stores' vectors
        hits = on_b.vector_stores.search(store.id, query="adoption leave").data
        assert [hit.file_id for hit in hits] == [handbook.id]
    index_b = pipeline_b.services.rag.stores().index
    assert index_b.holds(first.id) and index_b.holds(second.id)
    assert HANDBOOK not in raw_redis(shared_redis)  # sealed at rest

    # A file deleted on A: gone from both stores, its chunks too, and from B's index.
    assert on_a.files.delete(handbook.id).deleted
    with pytest.raises(openai.NotFoundError):
        on_b.files.retrieve(handbook.id)
    for store in (first, second):
        assert on_b.vector_stores.files.list(store.id).data == []
        assert on_b.vector_stores.search(store.id, query="adoption leave").data == []
    raw = raw_redis(shared_redis)
    assert handbook.id.encode() not in raw
    eventually(lambda: not index_b.holds(first.id) and not index_b.holds(second.id))

    # A store deleted on A: 404 on B at once, and B frees its vectors at its next sweep
    # (before, they stayed in B's memory until a restart).
    manual = on_a.files.create(file=("manual.txt", HANDBOOK), purpose="assistants")
    third = on_a.vector_stores.create(name="third", file_ids=[manual.id])
    assert on_b.vector_stores.search(third.id, query="remote work").data
    assert index_b.holds(third.id)
    assert on_a.vector_stores.delete(third.id).deleted
    with pytest.raises(openai.NotFoundError):
        on_b.vector_stores.search(third.id, query="remote work")
    with pytest.raises(openai.NotFoundError):
        on_b.vector_stores.retrieve(third.id)
    eventually(lambda: not index_b.holds(third.id))
    assert third.id.encode() not in raw_redis(shared_redis)
    on_b.files.retrieve(manual.id)  # the file itself stays: only the store went


def test_responses_agent_state_and_cached_answers_deleted_everywhere(replicas, shared_redis, sdk):
    a, b, _ = replicas
    key = create_key(a)
    on_a, on_b = sdk(a, key), sdk(b, key)
    response = on_a.responses.create(model="sim", input=SECRET)
    assert on_b.responses.retrieve(response.id).id == response.id
    on_b.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        on_a.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        on_a.responses.create(model="sim", input="and?", previous_response_id=response.id)
    assert response.id.encode() not in raw_redis(shared_redis)

    headers = {"Authorization": f"Bearer {key}"}
    put = httpx.put(f"{a}/v1/agents/bot/state", json={"state": {"note": SECRET}}, headers=headers)
    assert put.status_code in (200, 201), put.text
    assert httpx.delete(f"{b}/v1/agents/bot/state", headers=headers).status_code in (200, 204)
    assert httpx.get(f"{a}/v1/agents/bot/state", headers=headers).status_code == 404
    assert b"bot" not in raw_redis(shared_redis).split(b"agent_state")[-1]

    messages = [{"role": "user", "content": SECRET}]
    on_a.chat.completions.create(model="sim", messages=messages, temperature=0)
    raw = raw_redis(shared_redis)
    assert b"cache:exact" in raw and SECRET.encode() not in raw  # cached, sealed
    flushed = httpx.delete(f"{b}/admin/cache", headers={"Authorization": f"Bearer {MASTER}"})
    assert flushed.status_code == 200 and flushed.json()["deleted"] >= 1
    assert b"cache:exact:e:" not in raw_redis(shared_redis)
