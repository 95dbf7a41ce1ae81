"""Retention per kind: expired documents read as gone at once (404 over HTTP) and the sweep purges
them with what hangs off them (a vector store's chunks, a file's chunks in every store)."""

from __future__ import annotations

import httpx
import pytest

from tests.clock import ManualClock
from tests.context.test_rag import WordEmbedder, loader
from titan.config.data_at_rest import RETENTION_NAMESPACES, DataAtRestConfig, parse_duration
from titan.context.rag.files import CONTENTS, FILES
from titan.context.rag.store_index import chunk_namespace
from titan.context.rag.vector_stores import STORES, VectorStores
from titan.context.retention_sweep import RetentionSweeper
from titan.storage import open_storage
from titan.storage.retained_documents import WRITTEN_AT

DAY = 86400.0
TEXT = b"Remote work is allowed three days a week. Adoption leave lasts sixteen weeks."


async def retained_storage(clock: ManualClock, **retention: str):
    config = DataAtRestConfig(retention=retention)
    return await open_storage("memory://", now=clock, data_at_rest=config)


def test_durations_parse_and_bad_ones_are_clear():
    assert parse_duration("30d") == 30 * DAY
    assert parse_duration("12h") == 12 * 3600
    assert parse_duration("2w") == 14 * DAY
    assert parse_duration(90) == 90.0
    for bad, words in [("30 days", "invalid duration"), ("0d", "positive"), (True, "duration")]:
        with pytest.raises(ValueError, match=words):
            parse_duration(bad)
    from titan.config import config_from_mapping
    from titan.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data_at_rest\.retention\.files"):
        config_from_mapping({"data_at_rest": {"retention": {"files": "soon"}}}, "titan.yaml")
    with pytest.raises(ConfigError, match="chats"):
        config_from_mapping({"data_at_rest": {"retention": {"chats": "1d"}}}, "titan.yaml")


def test_the_retained_namespaces_are_the_ones_the_code_writes():
    from titan.context.agent_state import NAMESPACE as AGENT_STATE
    from titan.context.conversations import NAMESPACE as RESPONSES
    from titan.jobs.batches import BATCHES, LINE_ERRORS

    assert (
        RETENTION_NAMESPACES["conversations"] == RETENTION_NAMESPACES["responses"] == (RESPONSES,)
    )
    assert RETENTION_NAMESPACES["files"] == (FILES, CONTENTS)
    assert RETENTION_NAMESPACES["agent_state"] == (AGENT_STATE,)
    assert RETENTION_NAMESPACES["vector_stores"] == (STORES,)
    assert RETENTION_NAMESPACES["batches"] == (BATCHES, LINE_ERRORS)
    both = DataAtRestConfig(retention={"conversations": "30d", "responses": "7d"})
    assert both.retention.seconds_by_namespace() == {"responses": 7 * DAY}


async def test_expired_documents_read_as_gone_before_any_sweep():
    clock = ManualClock(1_700_000_000.0)
    storage = await retained_storage(clock, conversations="1d")
    documents = storage.documents
    await documents.put("responses", "t\x1fresp_1", {"text": "hello"})
    await documents.put("agent_state", "t\x1fbot", {"state": 1})  # no retention: kept
    assert await documents.get("responses", "t\x1fresp_1") == {"text": "hello"}  # no stamp shown
    clock.now += DAY - 1
    assert [doc_id for doc_id, _ in await documents.list("responses")] == ["t\x1fresp_1"]
    clock.now += 1
    assert await documents.get("responses", "t\x1fresp_1") is None
    assert await documents.list("responses") == []
    assert await documents.get("agent_state", "t\x1fbot") == {"state": 1}
    # "Only if absent" succeeds over an expired document not purged yet.
    assert await documents.put_if("responses", "t\x1fresp_1", {"_version": "a"}, expected=None)
    assert await documents.get("responses", "t\x1fresp_1") == {"_version": "a"}


async def test_a_write_restarts_the_retention_and_old_data_is_stamped_not_dropped():
    clock = ManualClock(1_700_000_000.0)
    plain = await open_storage("memory://", now=clock)
    await plain.documents.put("agent_state", "t\x1fold", {"_version": "v", "state": 1})
    storage = await retained_storage(clock, agent_state="1h")
    storage.documents.inner.inner = plain.documents  # the same data, now with retention
    sweeper = RetentionSweeper(storage, lambda: None, interval_s=60, now=clock)
    assert await sweeper.sweep() == 0  # written before retention was on: its clock starts now
    stored = await plain.documents.get("agent_state", "t\x1fold")
    assert stored[WRITTEN_AT] == clock.now and stored["_version"] == "v"
    clock.now += 3000
    await storage.documents.put("agent_state", "t\x1fold", {"state": 2})
    clock.now += 3000
    assert await storage.documents.get("agent_state", "t\x1fold") == {"state": 2}
    clock.now += 600
    assert await sweeper.sweep() == 1
    assert await plain.documents.get("agent_state", "t\x1fold") is None


async def test_the_sweep_purges_expired_files_and_stores_with_their_chunks():
    clock = ManualClock(1_700_000_000.0)
    storage = await retained_storage(clock, files="2d", vector_stores="5d")
    documents = storage.documents
    stores = VectorStores(documents, loader(WordEmbedder()), clock)
    raw = storage.retention.inner  # below retention: what is really stored
    kept = await stores.files.create("t", "kept.txt", "assistants", TEXT, "text/plain")
    store = await stores.create("t", name="policies", file_ids=[kept["id"]])
    await stores.search("t", store["id"], "adoption leave")  # the index holds its vectors
    assert stores.index.holds(store["id"])
    clock.now += DAY
    doomed = await stores.files.create("t", "doomed.txt", "assistants", TEXT, "text/plain")
    clock.now += DAY  # the first file expires; the store was written a day ago
    await stores.add_file("t", store["id"], doomed["id"])
    sweeper = RetentionSweeper(storage, lambda: stores, interval_s=60, now=clock)
    assert await sweeper.sweep() == 1  # the first file (its content goes with it)
    assert await raw.get(FILES, f"t\x1f{kept['id']}") is None
    assert await raw.get(CONTENTS, f"t\x1f{kept['id']}") is None
    assert await raw.list(chunk_namespace(store["id"], kept["id"])) == []  # left the store
    files_left = (await stores.list_files("t", store["id"]))["data"]
    assert [f["id"] for f in files_left] == [doomed["id"]]
    assert (await stores.get("t", store["id"]))["file_counts"]["completed"] == 1
    found = await stores.search("t", store["id"], "adoption leave")
    assert {hit["file_id"] for hit in found["data"]} == {doomed["id"]}

    clock.now += 5 * DAY  # the store's last write (adding the file) was 5 days ago
    assert await sweeper.sweep() >= 1
    assert await raw.get(STORES, f"t\x1f{store['id']}") is None
    assert await raw.list(f"vector_store_files:{store['id']}") == []
    assert await raw.list(chunk_namespace(store["id"], doomed["id"])) == []
    assert not stores.index.holds(store["id"])


@pytest.mark.slow
def test_over_http_an_expired_response_is_a_404(monkeypatch):
    from tests.integration.harness import running_titan

    simulated = {"backend": "simulated", "profile": {"ttft_s": 0.001, "output_tokens": 4}}
    config = {
        "models": [{"name": "sim", "deployments": [simulated]}],
        "probes": {"enabled": False},
        "data_at_rest": {"retention": {"responses": "1s"}, "sweep_interval_s": 0.2},
    }
    with running_titan(config) as base_url:
        created = httpx.post(f"{base_url}/v1/responses", json={"model": "sim", "input": "hi"})
        response_id = created.json()["id"]
        assert httpx.get(f"{base_url}/v1/responses/{response_id}").status_code == 200
        import time

        time.sleep(1.1)
        gone = httpx.get(f"{base_url}/v1/responses/{response_id}")
        assert gone.status_code == 404 and gone.json()["error"]["param"] == "response_id"
        follow_up = httpx.post(f"{base_url}/v1/responses", json={
            "model": "sim", "input": "again", "previous_response_id": response_id})  # fmt: skip
        assert follow_up.status_code == 404
