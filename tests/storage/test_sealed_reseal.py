"""Finishing a key rotation: ``titan storage reseal`` rewrites every document under the current
key (plaintext from before encryption too), after which the old key can leave the config."""

from __future__ import annotations

import base64
import os

import pytest
from typer.testing import CliRunner

from titan.cli.main import build_cli
from titan.config.data_at_rest import DataAtRestConfig
from titan.errors import ConfigError
from titan.storage import open_storage
from titan.storage.sealed import DataKeyError
from titan.storage.sealed_reseal import reseal

SECRET = "quarterly numbers: 4.2M"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def protection(*keys: str, **retention: str) -> DataAtRestConfig:
    return DataAtRestConfig(encryption_keys=list(keys), retention=retention)


async def fill(url: str, key: str | None, **options) -> None:
    storage = await open_storage(url, **options, data_at_rest=protection(*([key] if key else [])))
    try:
        await storage.documents.put("responses", "t\x1fresp_1", {"text": SECRET})
        await storage.documents.put("vector_store_chunks:vs_1:file-1", "000000", {"t": SECRET})
        await storage.documents.put_if("agent_state", "t\x1fa", {"_version": "v1"}, expected=None)
    finally:
        await storage.close()


async def check_reseal(url: str, **options) -> None:
    old, new = new_key(), new_key()
    await fill(url, None, **options)  # from before encryption
    storage = await open_storage(url, **options, data_at_rest=protection(old))
    await storage.documents.put("files", "t\x1ffile-1", {"text": SECRET})
    await storage.close()

    rotated = await open_storage(url, **options, data_at_rest=protection(new, old))
    try:
        report = await reseal(rotated.documents)
        assert report.num_resealed == 4 and report.by_namespace["files"] == 1
        assert (await reseal(rotated.documents)).num_resealed == 0  # nothing left
    finally:
        await rotated.close()

    only_new = await open_storage(url, **options, data_at_rest=protection(new))
    try:
        assert (await only_new.documents.get("files", "t\x1ffile-1"))["text"] == SECRET
        assert (await only_new.documents.get("responses", "t\x1fresp_1"))["text"] == SECRET
        assert await only_new.documents.get("agent_state", "t\x1fa") == {"_version": "v1"}
    finally:
        await only_new.close()
    only_old = await open_storage(url, **options, data_at_rest=protection(old))
    try:
        with pytest.raises(DataKeyError):
            await only_old.documents.get("files", "t\x1ffile-1")
    finally:
        await only_old.close()


async def test_reseal_on_sqlite(tmp_path):
    await check_reseal(f"sqlite:///{tmp_path}/titan.db")


@pytest.mark.redis
async def test_reseal_on_redis(redis_url, redis_prefix):
    await check_reseal(redis_url, key_prefix=redis_prefix)


async def test_reseal_keeps_the_retention_clock_and_needs_a_key():
    clock = [1000.0]
    storage = await open_storage(
        "memory://", now=lambda: clock[0], data_at_rest=protection(files="1h")
    )
    await storage.documents.put("files", "t\x1ff", {"text": SECRET})
    with pytest.raises(ConfigError, match="encryption_keys"):
        await reseal(storage.documents.inner)
    raw = storage.documents.inner.inner
    sealed = await open_storage("memory://", data_at_rest=protection(new_key()))
    sealed.documents.inner = raw
    clock[0] = 2000.0
    assert (await reseal(sealed.documents)).num_resealed == 1
    assert (await raw.get("files", "t\x1ff"))["_written_at"] == 1000.0


def test_the_cli_reseals_with_the_keys_of_the_config(tmp_path, monkeypatch):
    monkeypatch.delenv("TITAN_STORAGE")
    old, new = new_key(), new_key()
    url = f"sqlite:///{tmp_path}/titan.db"
    config = tmp_path / "titan.yaml"
    config.write_text(
        f"storage: '{url}'\ndata_at_rest:\n  encryption_keys: ['${{NEW_KEY}}', '${{OLD_KEY}}']\n"
    )
    import asyncio

    asyncio.run(fill(url, old))
    runner = CliRunner()
    env = {"NEW_KEY": new, "OLD_KEY": old}
    result = runner.invoke(build_cli(), ["storage", "reseal", "--config", str(config)], env=env)
    assert result.exit_code == 0, result.output
    assert "resealed 3 document(s)" in result.output and new not in result.output
    config.write_text(f"storage: '{url}'\ndata_at_rest:\n  encryption_keys: ['not-a-key']\n")
    result = runner.invoke(build_cli(), ["storage", "reseal", "--config", str(config)])
    assert result.exit_code == 2 and "encryption_keys" in result.output
