"""Authentication says why auth is on: at start (the log) and in every 401 (how many keys are
active in which storage), and nothing else about the keys."""

from __future__ import annotations

import logging

import pytest

from tests.clock import ManualClock
from titan.config import config_from_mapping
from titan.errors import AuthenticationError
from titan.observability.metrics import TitanMetrics
from titan.service.authentication import Authenticator
from titan.service.storage_health import StorageHealth
from titan.storage import open_storage

STORE = "memory://"


async def authenticator(clock: ManualClock | None = None, **auth: object) -> Authenticator:
    config = config_from_mapping({"storage": STORE, "auth": auth}, "test", environ={})
    storage = await open_storage(STORE)
    health = StorageHealth(storage, TitanMetrics())
    return Authenticator(config, storage, health, now=clock or ManualClock())


async def test_the_start_log_names_the_storage_and_says_auth_is_off_without_keys(caplog):
    auth = await authenticator()
    with caplog.at_level(logging.INFO, logger="titan.auth"):
        await auth.start()
    assert "storage memory://; auth off: no API keys" in caplog.text


async def test_the_start_log_counts_active_and_inactive_keys(caplog):
    auth = await authenticator()
    await auth.keys.create("acme")
    _, revoked = await auth.keys.create("acme")
    await auth.keys.create("beta")
    await auth.keys.revoke(revoked.key_id)
    with caplog.at_level(logging.INFO, logger="titan.auth"):
        await auth.start()
    assert "auth on: 2 API keys active (1 revoked or expired)" in caplog.text
    assert "acme" not in caplog.text and revoked.key_id not in caplog.text


async def test_a_401_says_how_many_keys_are_active_in_which_storage_and_nothing_else():
    auth = await authenticator()
    _, record = await auth.keys.create("acme", name="web")
    await auth.start()
    with pytest.raises(AuthenticationError) as missing:
        await auth.key(None)
    assert missing.value.code == "missing_api_key"
    assert "this server needs one: it has 1 API key active in memory://" in missing.value.message
    assert "Authorization: Bearer" in missing.value.message
    with pytest.raises(AuthenticationError) as wrong:
        await auth.key("unused")  # what the openai SDK sends when told api_key="unused"
    assert "1 API key active in memory://" in wrong.value.message
    for secret in (record.key_id, record.tenant, record.name):
        assert secret not in missing.value.message and secret not in wrong.value.message


async def test_with_only_a_master_key_a_401_says_how_the_first_key_is_made():
    auth = await authenticator(master_key="sk-master-0123456789")
    auth.config = auth.config.model_copy(
        update={"server": auth.config.server.model_copy(update={"host": "0.0.0.0"})}
    )
    await auth.start()
    assert auth.is_auth_on
    with pytest.raises(AuthenticationError, match=r"auth.master_key is set .* POST /admin/keys"):
        await auth.key(None)


async def test_a_titan_key_presented_while_auth_looks_off_is_checked_at_once():
    """A key made a moment ago elsewhere: its first requests must be its own (its tenant's),
    not anonymous ones, although the server last looked for keys less than key_cache_s ago."""
    clock = ManualClock()
    auth = await authenticator(clock, key_cache_s=60)
    await auth.start()
    assert not auth.is_auth_on
    other = await authenticator(clock)  # another process on the same storage: `titan keys`
    other.keys = auth.keys  # memory:// is per process: share the one store
    plaintext, _ = await other.keys.create("acme")
    assert await auth.identify("unused") == ("", None)  # not a Titan key: auth still looks off
    assert (await auth.identify(plaintext))[0] == "acme"
    assert auth.is_auth_on
