"""Agent state: one JSON object per (tenant, agent id), versioned for optimistic concurrency.

Every write is one ``DocumentStore.put_if`` that expects the version it read, so no update is ever
lost: a write with ``If-Match`` fails with 412 when the version moved; one without retries its
read-modify-write until its ``put_if`` wins (last writer wins, but a PATCH merges into the latest).

A stored document: ``{"_version", "revision", "tenant", "agent_id", "state", "updated_at",
"expires_at", "is_deleted"}``. ``_version`` is random (a deleted and recreated state never reuses an
ETag); ``revision`` counts writes. Expired (``expires_at`` passed) and deleted (a tombstone left
by a conditional delete) documents read as absent; the next write replaces them.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from titan.errors import (
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PreconditionFailedError,
    ServiceUnavailableError,
)
from titan.storage.base import DocumentStore

NAMESPACE = "agent_state"
MAX_STATE_BYTES = 256 * 1024  # of the state's JSON
MAX_TTL_S = 10 * 365 * 86400.0
MAX_ATTEMPTS = 200  # read-modify-write rounds before giving up on a contended document
AGENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Ids join tenant and agent with a unit separator: agent ids cannot contain it, so the last one
# splits any (tenant, agent) pair unambiguously.
SEPARATOR = "\x1f"


@dataclass(frozen=True)
class AgentState:
    agent_id: str
    state: dict[str, Any]
    version: str
    revision: int
    updated_at: float
    expires_at: float | None
    is_created: bool = False  # this write created it (PUT answers 201)

    @property
    def etag(self) -> str:
        return f'"{self.version}"'


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: null deletes a member, objects merge recursively, anything else
    (arrays included) replaces. Returns a new value; neither argument is changed."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result


def validate_agent_id(agent_id: str) -> str:
    if not AGENT_ID.fullmatch(agent_id):
        raise InvalidRequestError(
            f"Invalid agent id {agent_id[:140]!r}: use 1-128 characters of A-Z, a-z, 0-9, "
            "'.', '_', ':' and '-'.",
            param="agent_id",
        )
    return agent_id


def validate_ttl(ttl_s: float | None) -> float | None:
    if ttl_s is not None and not 0 < ttl_s <= MAX_TTL_S:
        raise InvalidRequestError(
            f"Invalid ttl_s {ttl_s}: give seconds above 0 and at most {MAX_TTL_S:.0f}.",
            param="ttl_s",
        )
    return ttl_s


def parse_if_match(header: str | None) -> tuple[bool, frozenset[str]] | None:
    """``If-Match`` as (is_any, versions): None when absent; ``*`` is any existing version;
    otherwise a comma-separated list of (possibly weak) quoted ETags."""
    if header is None:
        return None
    header = header.strip()
    if header == "*":
        return True, frozenset()
    versions = set()
    for tag in header.split(","):
        tag = tag.strip().removeprefix("W/")
        if len(tag) < 2 or not (tag.startswith('"') and tag.endswith('"')):
            raise InvalidRequestError(
                f"Invalid If-Match header {header[:200]!r}: give '*' or quoted ETags as returned "
                'in the ETag header, e.g. If-Match: "abc".',
                param="If-Match",
            )
        versions.add(tag[1:-1])
    return False, frozenset(versions)


class AgentStates:
    """Tenant-scoped agent state on a ``DocumentStore``; ``now`` is wall-clock unix seconds
    (expiry is compared across replicas)."""

    def __init__(self, documents: DocumentStore, now: Callable[[], float] = time.time) -> None:
        self._documents = documents
        self._now = now

    async def get(self, tenant: str, agent_id: str) -> AgentState:
        doc = self._live(await self._read(tenant, agent_id))
        if doc is None:
            raise _not_found(agent_id)
        return _state_of(doc)

    async def put(
        self,
        tenant: str,
        agent_id: str,
        state: Mapping[str, Any],
        if_match: str | None = None,
        ttl_s: float | None = None,
    ) -> AgentState:
        """Replace the state (creating it); the expiry becomes ``ttl_s`` from now (None: none)."""
        validate_ttl(ttl_s)
        return await self._write(
            tenant, agent_id, if_match, lambda _current: (dict(state), ttl_s, True)
        )

    async def patch(
        self,
        tenant: str,
        agent_id: str,
        patch: Mapping[str, Any],
        if_match: str | None = None,
        ttl_s: float | None = None,
    ) -> AgentState:
        """Merge ``patch`` (RFC 7396) into the state (into ``{}`` when absent); ``ttl_s`` None
        keeps the current expiry."""
        validate_ttl(ttl_s)

        def change(current: dict[str, Any] | None) -> tuple[dict[str, Any], float | None, bool]:
            target = {} if current is None else current["state"]
            return merge_patch(target, dict(patch)), ttl_s, ttl_s is not None

        return await self._write(tenant, agent_id, if_match, change)

    async def delete(self, tenant: str, agent_id: str, if_match: str | None = None) -> None:
        """Delete the state; NotFoundError when there is none (412 with a failed ``If-Match``).

        With ``If-Match`` the check and the delete are one ``put_if`` of a tombstone (read as
        absent), since the store has no conditional delete; without, the document is removed."""
        validate_agent_id(agent_id)
        condition = parse_if_match(if_match)
        doc_id = _doc_id(tenant, agent_id)
        for attempt in range(MAX_ATTEMPTS):
            stored = await self._documents.get(NAMESPACE, doc_id)
            live = self._live(stored)
            if condition is None:
                await self._documents.delete(NAMESPACE, doc_id)
                if live is None:
                    raise _not_found(agent_id)
                return
            current = _check(condition, live, agent_id)
            tombstone = {**current, "_version": _new_version(), "is_deleted": True, "state": {}}
            tombstone["updated_at"] = self._now()
            if await self._documents.put_if(
                NAMESPACE, doc_id, tombstone, expected=current["_version"]
            ):
                return
            await _back_off(attempt)
        raise _contended(agent_id)

    # ---- internals -----------------------------------------------------------------------

    async def _read(self, tenant: str, agent_id: str) -> dict[str, Any] | None:
        validate_agent_id(agent_id)
        return await self._documents.get(NAMESPACE, _doc_id(tenant, agent_id))

    def _live(self, doc: dict[str, Any] | None) -> dict[str, Any] | None:
        if doc is None or doc.get("is_deleted"):
            return None
        expires_at = doc.get("expires_at")
        if expires_at is not None and expires_at <= self._now():
            return None
        return doc

    async def _write(
        self,
        tenant: str,
        agent_id: str,
        if_match: str | None,
        change: Callable[[dict[str, Any] | None], tuple[dict[str, Any], float | None, bool]],
    ) -> AgentState:
        """The read-modify-write loop. ``change(live document or None)`` gives (new state, ttl_s,
        whether ttl_s sets the expiry or the current one stays)."""
        validate_agent_id(agent_id)
        condition = parse_if_match(if_match)
        doc_id = _doc_id(tenant, agent_id)
        for attempt in range(MAX_ATTEMPTS):
            stored = await self._documents.get(NAMESPACE, doc_id)
            live = self._live(stored)
            if condition is not None:
                _check(condition, live, agent_id)
            state, ttl_s, sets_expiry = change(live)
            _check_size(state)
            now = self._now()
            if sets_expiry or live is None:
                expires_at = None if ttl_s is None else now + ttl_s
            else:
                expires_at = live.get("expires_at")
            doc = {
                "_version": _new_version(),
                "revision": (stored or {}).get("revision", 0) + 1,
                "tenant": tenant,
                "agent_id": agent_id,
                "state": state,
                "updated_at": now,
                "expires_at": expires_at,
                "is_deleted": False,
            }
            expected = None if stored is None else stored.get("_version")
            if await self._documents.put_if(NAMESPACE, doc_id, doc, expected=expected):
                return _state_of(doc, is_created=live is None)
            await _back_off(attempt)
        raise _contended(agent_id)


def _doc_id(tenant: str, agent_id: str) -> str:
    return f"{tenant}{SEPARATOR}{agent_id}"


def _new_version() -> str:
    return uuid.uuid4().hex


def _state_of(doc: dict[str, Any], *, is_created: bool = False) -> AgentState:
    return AgentState(
        agent_id=doc["agent_id"],
        state=doc["state"],
        version=doc["_version"],
        revision=doc["revision"],
        updated_at=doc["updated_at"],
        expires_at=doc["expires_at"],
        is_created=is_created,
    )


def _check(
    condition: tuple[bool, frozenset[str]], live: dict[str, Any] | None, agent_id: str
) -> dict[str, Any]:
    """The live document when it satisfies ``If-Match``; PreconditionFailedError otherwise."""
    is_any, versions = condition
    if live is None:
        raise PreconditionFailedError(
            f"If-Match failed: agent '{agent_id}' has no state (no current ETag).",
            param="If-Match",
        )
    if not is_any and live["_version"] not in versions:
        raise PreconditionFailedError(
            f"If-Match failed: the state of agent '{agent_id}' changed; its current ETag is "
            f'"{live["_version"]}". GET it again and retry.',
            param="If-Match",
        )
    return live


def _check_size(state: dict[str, Any]) -> None:
    try:
        num_bytes = len(orjson.dumps(state))
    except TypeError as exc:  # not JSON (only possible for Python callers)
        raise InvalidRequestError(f"Agent state must be JSON: {exc}.") from None
    if num_bytes > MAX_STATE_BYTES:
        raise PayloadTooLargeError(
            f"Agent state is {num_bytes} bytes of JSON; the limit is {MAX_STATE_BYTES}.",
            code="state_too_large",
        )


async def _back_off(attempt: int) -> None:
    # Jitter spreads writers that lost the same round; the first retries are immediate-ish.
    await asyncio.sleep(random.uniform(0, min(0.05, 0.0005 * (attempt + 1))))


def _not_found(agent_id: str) -> NotFoundError:
    return NotFoundError(f"Agent '{agent_id}' has no state.", param="agent_id")


def _contended(agent_id: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"The state of agent '{agent_id}' is changing too often to write; retry shortly.",
        code="state_contended",
    )
