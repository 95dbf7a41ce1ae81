"""Agent state: RFC 7396 merge patch, versions and If-Match, TTL, size limit, tenant isolation,
and concurrent writers losing nothing."""

from __future__ import annotations

import asyncio

import pytest

from tests.clock import ManualClock
from titan.context.agent_state import (
    MAX_STATE_BYTES,
    AgentStates,
    merge_patch,
    parse_if_match,
)
from titan.errors import (
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PreconditionFailedError,
)
from titan.storage.memory import MemoryDocuments
from titan.storage.sqlite import SqliteDatabase, SqliteDocuments


@pytest.fixture
def states(clock: ManualClock) -> AgentStates:
    return AgentStates(MemoryDocuments(), now=clock)


# RFC 7396 appendix A, every example.
RFC_7396_CASES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7396_CASES)
def test_merge_patch_rfc_7396_examples(target, patch, result):
    before = repr(target)
    assert merge_patch(target, patch) == result
    assert repr(target) == before  # the target is not changed


def test_parse_if_match():
    assert parse_if_match(None) is None
    assert parse_if_match(" * ") == (True, frozenset())
    assert parse_if_match('"a", W/"b"') == (False, frozenset({"a", "b"}))
    with pytest.raises(InvalidRequestError):
        parse_if_match("a")


async def test_put_get_versions_and_etags(states: AgentStates, clock: ManualClock):
    created = await states.put("t", "agent-1", {"step": 1})
    assert created.is_created and created.revision == 1
    assert created.etag == f'"{created.version}"'
    got = await states.get("t", "agent-1")
    assert got.state == {"step": 1} and got.version == created.version
    assert got.updated_at == clock.now and got.expires_at is None
    clock.now += 5
    updated = await states.put("t", "agent-1", {"step": 2})
    assert not updated.is_created and updated.revision == 2
    assert updated.version != created.version and updated.updated_at == clock.now
    patched = await states.patch("t", "agent-1", {"notes": {"a": 1}, "step": None})
    assert patched.state == {"notes": {"a": 1}} and patched.revision == 3


async def test_get_missing_is_not_found(states: AgentStates):
    with pytest.raises(NotFoundError):
        await states.get("t", "nobody")


async def test_patch_creates_from_an_empty_object(states: AgentStates):
    result = await states.patch("t", "a", {"x": {"y": 1, "z": None}})
    assert result.is_created and result.state == {"x": {"y": 1}}


async def test_if_match_mismatch_is_412_naming_the_current_etag(states: AgentStates):
    first = await states.put("t", "a", {"n": 1})
    second = await states.put("t", "a", {"n": 2}, if_match=first.etag)
    with pytest.raises(PreconditionFailedError) as failed:
        await states.patch("t", "a", {"n": 3}, if_match=first.etag)
    assert failed.value.status_code == 412 and second.etag in failed.value.message
    assert (await states.get("t", "a")).state == {"n": 2}
    # Any of several ETags, weak or strong, matches.
    third = await states.patch("t", "a", {"n": 3}, if_match=f'"x", W/{second.etag}')
    assert third.state == {"n": 3}


async def test_if_match_star_means_must_exist(states: AgentStates):
    with pytest.raises(PreconditionFailedError):
        await states.put("t", "a", {"n": 1}, if_match="*")
    with pytest.raises(PreconditionFailedError):
        await states.patch("t", "a", {"n": 1}, if_match="*")
    await states.put("t", "a", {"n": 1})
    assert (await states.put("t", "a", {"n": 2}, if_match="*")).state == {"n": 2}


async def test_delete(states: AgentStates):
    with pytest.raises(NotFoundError):
        await states.delete("t", "a")
    first = await states.put("t", "a", {"n": 1})
    await states.delete("t", "a")
    with pytest.raises(NotFoundError):
        await states.get("t", "a")
    # Conditional delete: 412 on a stale ETag, then a tombstone that reads as absent.
    second = await states.put("t", "a", {"n": 2})
    assert second.is_created and second.version != first.version
    with pytest.raises(PreconditionFailedError):
        await states.delete("t", "a", if_match=first.etag)
    await states.delete("t", "a", if_match=second.etag)
    with pytest.raises(NotFoundError):
        await states.get("t", "a")
    with pytest.raises(PreconditionFailedError):
        await states.delete("t", "a", if_match="*")
    third = await states.put("t", "a", {"n": 3})
    assert third.is_created and third.revision > second.revision


async def test_ttl_expired_is_absent(states: AgentStates, clock: ManualClock):
    made = await states.put("t", "a", {"n": 1}, ttl_s=10)
    assert made.expires_at == clock.now + 10
    clock.now += 5
    # PATCH without ttl_s keeps the expiry; with one, resets it.
    assert (await states.patch("t", "a", {"m": 2})).expires_at == made.expires_at
    clock.now += 5
    with pytest.raises(NotFoundError):
        await states.get("t", "a")
    with pytest.raises(PreconditionFailedError):
        await states.patch("t", "a", {"n": 2}, if_match=made.etag)
    recreated = await states.patch("t", "a", {"n": 2}, ttl_s=30)
    assert recreated.is_created and recreated.state == {"n": 2}
    assert recreated.expires_at == clock.now + 30
    # PUT without ttl_s replaces the expiry too: none.
    assert (await states.put("t", "a", {"n": 3})).expires_at is None
    with pytest.raises(InvalidRequestError):
        await states.put("t", "a", {}, ttl_s=0)


async def test_size_limit(states: AgentStates):
    big = {"blob": "x" * MAX_STATE_BYTES}
    with pytest.raises(PayloadTooLargeError) as too_large:
        await states.put("t", "a", big)
    assert too_large.value.status_code == 413 and str(MAX_STATE_BYTES) in too_large.value.message
    await states.put("t", "a", {"blob": "x" * 1000})
    with pytest.raises(PayloadTooLargeError):
        await states.patch("t", "a", big)
    assert (await states.get("t", "a")).state == {"blob": "x" * 1000}


@pytest.mark.parametrize("agent_id", ["", "a" * 129, "a/b", "a b", "é", "a\x1fb"])
async def test_agent_id_is_validated(states: AgentStates, agent_id: str):
    with pytest.raises(InvalidRequestError):
        await states.put("t", agent_id, {})
    with pytest.raises(InvalidRequestError):
        await states.get("t", agent_id)


async def test_valid_agent_ids(states: AgentStates):
    for agent_id in ("a", "A-z_0.9:x", "a" * 128):
        await states.put("t", agent_id, {"id": agent_id})
        assert (await states.get("t", agent_id)).state == {"id": agent_id}


async def test_tenants_are_isolated(states: AgentStates):
    mine = await states.put("A", "shared-name", {"owner": "A"})
    with pytest.raises(NotFoundError):
        await states.get("B", "shared-name")
    with pytest.raises(PreconditionFailedError):
        await states.patch("B", "shared-name", {"x": 1}, if_match=mine.etag)
    with pytest.raises(NotFoundError):
        await states.delete("B", "shared-name")
    theirs = await states.put("B", "shared-name", {"owner": "B"})
    assert theirs.is_created
    assert (await states.get("A", "shared-name")).state == {"owner": "A"}
    assert (await states.get("B", "shared-name")).state == {"owner": "B"}


async def _concurrent_patches_lose_nothing(states: AgentStates) -> None:
    await states.put("t", "a", {"counters": {}})
    await asyncio.gather(
        *(states.patch("t", "a", {"counters": {f"k{i}": i}, f"f{i}": True}) for i in range(50))
    )
    state = (await states.get("t", "a")).state
    assert state["counters"] == {f"k{i}": i for i in range(50)}
    assert all(state[f"f{i}"] for i in range(50))
    assert (await states.get("t", "a")).revision == 51


async def test_50_concurrent_patches_without_if_match_lose_nothing(states: AgentStates):
    await _concurrent_patches_lose_nothing(states)


async def test_50_concurrent_patches_on_sqlite_lose_nothing(tmp_path):
    db = await SqliteDatabase.open(tmp_path / "t.db")
    try:
        await _concurrent_patches_lose_nothing(AgentStates(SqliteDocuments(db)))
    finally:
        await db.close()


async def test_state_is_stored_as_json(states: AgentStates):
    with pytest.raises(InvalidRequestError):
        await states.put("t", "a", {"when": object()})
