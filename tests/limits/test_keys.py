"""API keys: issue, authenticate, revoke, expire; the key cache; name validation."""

from __future__ import annotations

import hmac

import pytest

from tests.clock import ManualClock
from titan.config.admission import Budget
from titan.errors import AuthenticationError, InvalidRequestError, StorageUnavailableError
from titan.limits import keys as keys_module
from titan.limits.keys import NAMESPACE, ApiKey, KeyPolicy, KeyRing, hash_key, parse_key_id
from titan.storage.memory import MemoryDocuments


class CountingDocuments(MemoryDocuments):
    """Counts ``get`` calls, to tell cache hits from store reads."""

    def __init__(self) -> None:
        super().__init__()
        self.num_gets = 0

    async def get(self, namespace, doc_id):  # type: ignore[no-untyped-def]
        self.num_gets += 1
        return await super().get(namespace, doc_id)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000.0)


@pytest.fixture
def documents() -> CountingDocuments:
    return CountingDocuments()


@pytest.fixture
def ring(documents: CountingDocuments, clock: ManualClock) -> KeyRing:
    return KeyRing(documents, now=clock, cache_s=5.0)


async def auth_error(ring: KeyRing, presented: str) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as caught:
        await ring.authenticate(presented)
    assert caught.value.status_code == 401
    return caught.value


async def test_create_returns_a_well_formed_key_stored_only_hashed(
    ring: KeyRing, documents: CountingDocuments
) -> None:
    policy = KeyPolicy(models=("smol",), rpm=60, budget=Budget(usd=5, period="day"))
    key, record = await ring.create("acme", name="ci-bot", policy=policy)
    assert key.startswith(f"sk-titan-{record.key_id}-")
    assert parse_key_id(key) == record.key_id and len(record.key_id) == 12
    assert record.tenant == "acme" and record.name == "ci-bot" and record.policy == policy
    assert record.secret_hash == hash_key(key) and not record.is_revoked
    stored = await documents.get(NAMESPACE, record.key_id)
    assert stored is not None and ApiKey.model_validate(stored) == record
    assert key not in str(stored) and key.split("-", 3)[3] not in str(stored)
    assert "secret_hash" not in record.public() and record.public()["key_id"] == record.key_id
    assert record.secret_hash not in repr(record)


async def test_authenticate_accepts_the_key_and_uses_a_constant_time_compare(
    ring: KeyRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, record = await ring.create("acme")
    calls = []
    real = hmac.compare_digest

    def spy(a, b):  # type: ignore[no-untyped-def]
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert await ring.authenticate(key) == record
    assert await ring.authenticate(f"  {key}\n") == record
    assert calls and all(b == record.secret_hash for _, b in calls)


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "sk-abc",
        "Bearer sk-titan-0123456789ab-secret",
        "sk-titan-0123456789AB-secret",  # the id is lowercase hex
        "sk-titan-0123456789a-secret",
        "sk-titan-0123456789ab-",
        "sk-titan-0123456789absecret",
    ],
)
async def test_malformed_keys_are_refused_with_the_expected_format(
    ring: KeyRing, presented: str
) -> None:
    error = await auth_error(ring, presented)
    assert error.message.startswith("API keys look like 'sk-titan-")
    assert error.code == "invalid_api_key"


async def test_unknown_ids_and_wrong_secrets_are_refused_alike(ring: KeyRing) -> None:
    key, record = await ring.create("acme")
    unknown = await auth_error(ring, "sk-titan-0123456789ab-whatever")
    assert "Incorrect API key (id 0123456789ab)" in unknown.message
    wrong = await auth_error(ring, key[:-1] + ("A" if key[-1] != "A" else "B"))
    assert f"Incorrect API key (id {record.key_id})" in wrong.message
    assert key not in wrong.message


async def test_secrets_may_contain_dashes(ring: KeyRing, documents: CountingDocuments) -> None:
    key = "sk-titan-00000000abcd-se-cr-et"
    record = ApiKey(key_id="00000000abcd", tenant="t", secret_hash=hash_key(key), created_at=0)
    await documents.put(NAMESPACE, record.key_id, record.model_dump(mode="json"))
    assert parse_key_id(key) == "00000000abcd"
    assert await ring.authenticate(key) == record


async def test_revoked_keys_are_refused_at_once_here(ring: KeyRing, clock: ManualClock) -> None:
    key, record = await ring.create("acme")
    await ring.authenticate(key)  # cached now
    clock.now += 1
    assert await ring.revoke(record.key_id) is True
    error = await auth_error(ring, key)
    assert f"{record.key_id} was revoked on" in error.message
    stored = await ring.get(record.key_id)
    assert stored is not None and stored.revoked_at == clock.now
    clock.now += 10
    assert await ring.revoke(record.key_id) is True  # again: keeps the first time
    stored = await ring.get(record.key_id)
    assert stored is not None and stored.revoked_at == clock.now - 10
    assert await ring.revoke("0123456789ab") is False


async def test_a_revocation_elsewhere_applies_within_the_cache_time(
    documents: CountingDocuments, clock: ManualClock
) -> None:
    here = KeyRing(documents, now=clock, cache_s=5.0)
    elsewhere = KeyRing(documents, now=clock, cache_s=5.0)
    key, record = await here.create("acme")
    await here.authenticate(key)
    await elsewhere.revoke(record.key_id)
    clock.now += 4.9
    assert await here.authenticate(key) == record  # still cached
    clock.now += 0.2
    await auth_error(here, key)


async def test_lookups_are_cached_per_instance_hits_only(
    ring: KeyRing, documents: CountingDocuments, clock: ManualClock
) -> None:
    key, _ = await ring.create("acme")
    documents.num_gets = 0
    for _ in range(3):
        await ring.authenticate(key)
    assert documents.num_gets == 1
    clock.now += 5
    await ring.authenticate(key)
    assert documents.num_gets == 2
    for _ in range(2):  # misses go to the store every time
        await auth_error(ring, "sk-titan-0123456789ab-whatever")
    assert documents.num_gets == 4
    uncached = KeyRing(documents, now=clock, cache_s=0)
    await uncached.authenticate(key)
    await uncached.authenticate(key)
    assert documents.num_gets == 6


async def test_the_cache_is_bounded(
    ring: KeyRing, documents: CountingDocuments, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys_module, "MAX_CACHED_KEYS", 2)
    created = [await ring.create("acme") for _ in range(3)]
    for key, _ in created:
        await ring.authenticate(key)
    documents.num_gets = 0
    await ring.authenticate(created[2][0])
    await ring.authenticate(created[1][0])
    assert documents.num_gets == 0
    await ring.authenticate(created[0][0])  # evicted first (least recently used)
    assert documents.num_gets == 1


async def test_expired_keys_are_refused(ring: KeyRing, clock: ManualClock) -> None:
    key, record = await ring.create("acme", policy=KeyPolicy(expires_at=clock.now + 60))
    assert not record.is_expired(clock.now)
    assert await ring.authenticate(key) == record
    clock.now += 60
    assert record.is_expired(clock.now)
    error = await auth_error(ring, key)
    assert f"{record.key_id} expired on" in error.message


async def test_list_get_and_has_keys(ring: KeyRing, clock: ManualClock) -> None:
    assert await ring.has_keys() is False and await ring.list() == []
    _, first = await ring.create("acme")
    clock.now += 1
    _, second = await ring.create("globex", name="batch.jobs_1")
    clock.now += 1
    _, third = await ring.create("acme")
    assert [k.key_id for k in await ring.list()] == [first.key_id, second.key_id, third.key_id]
    assert [k.key_id for k in await ring.list("acme")] == [first.key_id, third.key_id]
    assert await ring.get(second.key_id) == second and await ring.get("0123456789ab") is None
    await ring.revoke(first.key_id)
    await ring.revoke(second.key_id)
    await ring.revoke(third.key_id)
    assert await ring.has_keys() is True  # revoking every key does not turn auth off


@pytest.mark.parametrize("tenant", ["", "a" * 65, "acme corp", "acme/x", "ünïcode", "a|b"])
async def test_tenant_names_are_validated(ring: KeyRing, tenant: str) -> None:
    with pytest.raises(InvalidRequestError, match="invalid tenant name"):
        await ring.create(tenant)
    with pytest.raises(InvalidRequestError, match="invalid tenant name"):
        await ring.list(tenant)


async def test_key_names_are_validated(ring: KeyRing) -> None:
    with pytest.raises(InvalidRequestError, match="invalid key name 'my key'"):
        await ring.create("acme", name="my key")
    _, record = await ring.create("a" * 64, name="A.b_c-9")
    assert record.name == "A.b_c-9"


def test_key_policy_is_frozen_and_strict() -> None:
    with pytest.raises(ValueError):
        KeyPolicy(rpm=0)
    with pytest.raises(ValueError):
        KeyPolicy(modles=("x",))  # type: ignore[call-arg]
    policy = KeyPolicy(models=("a",))
    with pytest.raises(ValueError):
        policy.rpm = 5  # type: ignore[misc]
    assert policy.allows_model("a") and not policy.allows_model("b")
    assert KeyPolicy().allows_model("anything")


class DownDocuments(CountingDocuments):
    """A store that can become unreachable."""

    is_down = False

    async def get(self, namespace, doc_id):  # type: ignore[no-untyped-def]
        if self.is_down:
            raise StorageUnavailableError("down")
        return await super().get(namespace, doc_id)


async def test_an_unreachable_store_serves_recent_keys_from_the_cache_and_refuses_others(
    clock: ManualClock,
) -> None:
    documents = DownDocuments()
    stale: list[StorageUnavailableError] = []
    ring = KeyRing(documents, now=clock, cache_s=5.0, stale_if_error_s=60.0, on_stale=stale.append)
    known, _ = await ring.create("acme")
    unknown, _ = await ring.create("acme")
    await ring.authenticate(known)
    documents.is_down = True
    clock.now += 30  # past cache_s, within stale_if_error_s
    assert (await ring.authenticate(known)).tenant == "acme"
    assert len(stale) == 1
    with pytest.raises(StorageUnavailableError):  # 503, not 401: it may well be valid
        await ring.authenticate(unknown)
    clock.now += 31  # past stale_if_error_s
    with pytest.raises(StorageUnavailableError):
        await ring.authenticate(known)
    documents.is_down = False
    assert (await ring.authenticate(unknown)).tenant == "acme"
