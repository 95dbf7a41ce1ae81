"""Encryption at rest: documents, cached answers and jobs sealed with AES-256-GCM on every store,
key rotation, plaintext written before encryption, and clear errors for a wrong or missing key.
The raw-bytes tests read SQLite's rows and Redis's hashes directly: the plaintext is not there."""

from __future__ import annotations

import base64
import os
import sqlite3
import time

import pytest
import redis

from titan.config.data_at_rest import DataAtRestConfig, decode_key
from titan.errors import ServiceUnavailableError
from titan.storage import open_storage
from titan.storage.base import CacheEntry, Job
from titan.storage.sealed import CONFIG_KEY, DataKeyError, Keyring, SealedDocuments

SECRET = "my IBAN is DE89370400440532013000"
QUESTION = "what is the capital of atlantis exactly"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def config(*keys: str) -> DataAtRestConfig:
    return DataAtRestConfig(encryption_keys=list(keys))


async def write_everything(storage) -> None:
    await storage.documents.put("files", "t\x1ffile-1", {"id": "file-1", "text": SECRET})
    await storage.documents.put_if(
        "agent_state", "t\x1fbot", {"_version": "v1", "state": {"note": SECRET}}, expected=None
    )
    entry = CacheEntry(
        "k1", SECRET.encode(), 1e12 - 10, 1e12, {"tenant": "t", "model": "m", "scope": "s1",
                                                 "question": QUESTION}, b"\x01\x02\x03\x04"
    )  # fmt: skip
    await storage.cache.put("semantic", entry, max_entries=10)
    job = Job(id="job_1", tenant="t", payload={"body": {"prompt": SECRET}}, created_at=1.0)
    await storage.jobs.submit([job])


async def check_everything_reads_back(storage) -> None:
    assert (await storage.documents.get("files", "t\x1ffile-1"))["text"] == SECRET
    state = await storage.documents.get("agent_state", "t\x1fbot")
    assert state == {"_version": "v1", "state": {"note": SECRET}}
    assert await storage.documents.put_if(
        "agent_state", "t\x1fbot", {"_version": "v2", "state": {}}, expected="v1"
    )  # the version is compared in the store, in clear
    entry = await storage.cache.get("semantic", "k1")
    assert entry.value == SECRET.encode()
    assert entry.tags == {"tenant": "t", "model": "m", "scope": "s1", "question": QUESTION}
    assert entry.embedding == b"\x01\x02\x03\x04"
    (added,) = await storage.cache.added_since("semantic", 0)
    assert added.tags["question"] == QUESTION
    job = await storage.jobs.get("t", "job_1")
    assert job.payload == {"body": {"prompt": SECRET}}
    (claimed,) = await storage.jobs.claim("w", limit=5, lease_s=60, now=2.0)
    assert claimed.payload["body"]["prompt"] == SECRET
    assert await storage.jobs.settle("job_1", "w", state="succeeded", now=3.0,
                                     result={"answer": SECRET})  # fmt: skip
    assert (await storage.jobs.get("t", "job_1")).result == {"answer": SECRET}
    # Selection tags stay in clear: a flush by tenant still finds the entry.
    assert await storage.cache.flush("semantic", tenant="t") == 1


async def test_sqlite_rows_hold_no_plaintext(tmp_path):
    path = tmp_path / "sealed.db"
    storage = await open_storage(f"sqlite:///{path}", data_at_rest=config(new_key()))
    try:
        await write_everything(storage)
        await storage.jobs.settle("job_1", "nobody", state="succeeded", now=1.0)  # not leased
        raw = _sqlite_dump(path)
        assert SECRET.encode() not in raw and QUESTION.encode() not in raw
        assert b"DE89370400440532013000" not in raw
        assert b"ts1." in raw  # the documents are envelopes
        await check_everything_reads_back(storage)
        raw = _sqlite_dump(path)
        assert SECRET.encode() not in raw  # the job's result too
    finally:
        await storage.close()


def _sqlite_dump(path) -> bytes:
    connection = sqlite3.connect(path)
    try:
        return "\n".join(connection.iterdump()).encode()
    finally:
        connection.close()


@pytest.mark.redis
async def test_redis_hashes_hold_no_plaintext(redis_url, redis_prefix):
    storage = await open_storage(redis_url, key_prefix=redis_prefix, data_at_rest=config(new_key()))
    client = redis.Redis.from_url(redis_url)
    try:
        await write_everything(storage)
        raw_file = client.hget(f"{redis_prefix}doc:files", "t\x1ffile-1")
        assert raw_file is not None and SECRET.encode() not in raw_file
        assert b'"_sealed":"ts1.' in raw_file
        everything = b"".join(_redis_values(client, redis_prefix))
        assert SECRET.encode() not in everything and QUESTION.encode() not in everything
        await check_everything_reads_back(storage)
        everything = b"".join(_redis_values(client, redis_prefix))
        assert SECRET.encode() not in everything
    finally:
        client.close()
        await storage.close()


def _redis_values(client: redis.Redis, prefix: str) -> list[bytes]:
    values = []
    for key in client.scan_iter(match=f"{prefix}*"):
        kind = client.type(key)
        if kind == b"hash":
            values += [k + b"=" + v for k, v in client.hgetall(key).items()]
        elif kind == b"string":
            values.append(client.get(key))
        elif kind == b"zset":
            values += client.zrange(key, 0, -1)
    return values


async def test_a_ciphertext_copied_to_another_id_or_tenant_fails_to_open():
    storage = await open_storage("memory://", data_at_rest=config(new_key()))
    raw = storage.documents.inner
    await storage.documents.put("files", "alice\x1ffile-1", {"text": SECRET})
    stolen = await raw.get("files", "alice\x1ffile-1")
    await raw.put("files", "mallory\x1ffile-1", stolen)
    with pytest.raises(DataKeyError, match="altered, or copied"):
        await storage.documents.get("files", "mallory\x1ffile-1")
    await raw.put("responses", "alice\x1ffile-1", stolen)  # same id, another namespace
    with pytest.raises(DataKeyError):
        await storage.documents.get("responses", "alice\x1ffile-1")
    # Every write draws a new nonce: the same document never seals to the same bytes.
    await storage.documents.put("files", "alice\x1ffile-1", {"text": SECRET})
    assert (await raw.get("files", "alice\x1ffile-1")) != stolen


async def test_a_cached_value_copied_to_another_key_fails_to_open():
    storage = await open_storage("memory://", now=lambda: 100.0, data_at_rest=config(new_key()))
    entry = CacheEntry("k1", SECRET.encode(), 100.0, 200.0, {"tenant": "a", "model": "m"})
    await storage.cache.put("exact", entry, max_entries=10)
    raw = await storage.cache.inner.get("exact", "k1")
    assert SECRET.encode() not in raw.value
    await storage.cache.inner.put("exact", CacheEntry("k2", raw.value, 100.0, 200.0, raw.tags),
                                  max_entries=10)  # fmt: skip
    assert await storage.cache.get("exact", "k2") is None  # a cached answer: a miss, not a 503
    assert (await storage.cache.get("exact", "k1")).value == SECRET.encode()
    rotated = type(storage.cache)(storage.cache.inner, Keyring([decode_key(new_key())]))
    assert await rotated.get("exact", "k1") is None  # its key left the config
    assert await rotated.added_since("exact", 0) == []


async def test_key_rotation_the_first_key_seals_every_key_opens(tmp_path):
    old, new = new_key(), new_key()
    url = f"sqlite:///{tmp_path}/rotate.db"
    storage = await open_storage(url, data_at_rest=config(old))
    await storage.documents.put("responses", "t\x1fresp_1", {"text": SECRET})
    await storage.close()

    rotated = await open_storage(url, data_at_rest=config(new, old))
    try:
        documents = rotated.documents
        assert (await documents.get("responses", "t\x1fresp_1"))["text"] == SECRET
        stored = await documents.inner.get("responses", "t\x1fresp_1")
        assert documents.needs_reseal("responses", stored)  # still under the old key
        await documents.put("responses", "t\x1fresp_2", {"text": "new"})
        assert not documents.needs_reseal(
            "responses", await documents.inner.get("responses", "t\x1fresp_2")
        )
    finally:
        await rotated.close()

    # The old key dropped too early: a clear 503 naming the config key and the missing key id.
    without_old = await open_storage(url, data_at_rest=config(new))
    try:
        with pytest.raises(ServiceUnavailableError) as raised:
            await without_old.documents.get("responses", "t\x1fresp_1")
        error = raised.value
        assert error.status_code == 503 and CONFIG_KEY in error.message
        old_id = Keyring([decode_key(old)]).current_key_id()
        assert old_id in error.message
        assert old not in error.message and new not in error.message
        assert (await without_old.documents.get("responses", "t\x1fresp_2"))["text"] == "new"
    finally:
        await without_old.close()


async def test_plaintext_written_before_encryption_reads_and_is_sealed_on_its_next_write(tmp_path):
    url = f"sqlite:///{tmp_path}/upgrade.db"
    plain = await open_storage(url, data_at_rest=config())
    await plain.documents.put("files", "t\x1ff", {"text": SECRET})
    await plain.cache.put("exact", CacheEntry("k", b"answer", 1.0, 1e12, {"tenant": "t"}),
                          max_entries=10)  # fmt: skip
    assert (await plain.documents.inner.get("files", "t\x1ff")) == {"text": SECRET}
    await plain.close()

    sealed = await open_storage(url, data_at_rest=config(new_key()))
    try:
        assert (await sealed.documents.get("files", "t\x1ff")) == {"text": SECRET}
        assert (await sealed.cache.get("exact", "k")).value == b"answer"
        await sealed.documents.put("files", "t\x1ff", {"text": SECRET})
        assert SECRET not in str(await sealed.documents.inner.get("files", "t\x1ff"))
    finally:
        await sealed.close()

    # Sealed data with no key configured: refused clearly, never returned as an envelope.
    keyless = await open_storage(url, data_at_rest=config())
    try:
        with pytest.raises(DataKeyError, match="no data key is configured"):
            await keyless.documents.get("files", "t\x1ff")
        with pytest.raises(DataKeyError):
            await keyless.documents.list("files")
    finally:
        await keyless.close()


async def test_api_keys_stay_in_clear_and_an_empty_keyring_seals_nothing():
    documents = SealedDocuments(_Dict(), Keyring([decode_key(new_key())]))
    await documents.put("api_keys", "k", {"hash": "abc"})
    assert documents.inner.docs[("api_keys", "k")] == {"hash": "abc"}
    clear = SealedDocuments(_Dict(), Keyring())
    await clear.put("files", "f", {"text": SECRET})
    assert clear.inner.docs[("files", "f")] == {"text": SECRET}


class _Dict:
    def __init__(self):
        self.docs = {}

    async def put(self, namespace, doc_id, doc):
        self.docs[(namespace, doc_id)] = dict(doc)


@pytest.mark.parametrize("text", ["", "abc", "A" * 44, "00" * 31, "zz" * 32])
def test_a_bad_key_is_refused_at_config_load_without_showing_it(text):
    from titan.config import config_from_mapping
    from titan.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        config_from_mapping({"data_at_rest": {"encryption_keys": [text]}}, "titan.yaml")
    message = raised.value.message
    assert "data_at_rest.encryption_keys" in message and "32-byte key" in message
    if len(text) >= 8:
        assert text not in message


def test_keys_come_from_the_environment_hex_or_base64_and_are_never_shown(tmp_path):
    from titan.config import load_config
    from titan.config.summary import describe

    key_b64, key_hex = new_key(), os.urandom(32).hex()
    path = tmp_path / "titan.yaml"
    path.write_text(
        "data_at_rest:\n  encryption_keys: ['${TITAN_DATA_KEY}', '${TITAN_OLD_KEY}']\n"
        "  retention: {conversations: 30d, files: 12h}\n"
    )
    loaded = load_config(path, {"TITAN_DATA_KEY": key_b64, "TITAN_OLD_KEY": key_hex})
    assert loaded.data_at_rest.key_bytes() == [base64.b64decode(key_b64), bytes.fromhex(key_hex)]
    summary = describe(loaded)
    assert "encrypted (AES-256-GCM), 2 key(s) ***" in summary
    assert "retention conversations 30d, files 43200s" in summary
    for shown in (summary, repr(loaded), str(loaded.model_dump())):
        assert key_b64 not in shown and key_hex not in shown
    with pytest.raises(ValueError, match="repeats"):
        DataAtRestConfig(encryption_keys=[key_b64, key_b64])


@pytest.mark.slow
def test_over_http_a_wrong_key_is_a_503_naming_the_config_key(tmp_path, monkeypatch):
    import httpx

    from tests.integration.harness import running_titan

    monkeypatch.delenv("TITAN_STORAGE")  # the test-wide memory:// would override the file
    simulated = {"backend": "simulated", "profile": {"ttft_s": 0.001, "output_tokens": 4}}

    def titan_config(*keys: str) -> dict:
        return {
            "models": [{"name": "sim", "deployments": [simulated]}],
            "probes": {"enabled": False},
            "storage": f"sqlite:///{tmp_path}/titan.db",
            "data_at_rest": {"encryption_keys": list(keys)},
        }

    key = new_key()
    with running_titan(titan_config(key)) as base_url:
        note = {"file": ("note.txt", SECRET.encode(), "text/plain")}
        upload = httpx.post(f"{base_url}/v1/files", data={"purpose": "assistants"}, files=note)
        file_id = upload.json()["id"]
        content = httpx.get(f"{base_url}/v1/files/{file_id}/content")
        assert content.status_code == 200 and content.text == SECRET
        chat = {"model": "sim", "messages": [{"role": "user", "content": SECRET}]}
        job = httpx.post(f"{base_url}/v1/jobs", json={"endpoint": "/v1/chat/completions",
                                                      "body": chat}).json()  # fmt: skip
        for _ in range(500):  # the in-process worker runs it (sealed payload, sealed result)
            done = httpx.get(f"{base_url}/v1/jobs/{job['id']}").json()
            if done["status"] == "succeeded":
                break
            time.sleep(0.02)
        assert done["status"] == "succeeded", done
        assert done["result"]["choices"][0]["message"]["content"]
    assert SECRET.encode() not in _sqlite_dump(tmp_path / "titan.db")
    with running_titan(titan_config(new_key())) as base_url:
        answer = httpx.get(f"{base_url}/v1/files/{file_id}")
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "data_key_unavailable" and CONFIG_KEY in error["message"]
        assert key not in answer.text
        listing = httpx.get(f"{base_url}/v1/files")
        assert listing.status_code == 503
