"""API keys: issue, list, revoke and authenticate, stored hashed in a ``DocumentStore``.

A key reads ``sk-titan-{key_id}-{secret}``: ``key_id`` (12 lowercase hex characters) names the
stored record, so a lookup is one ``get``; ``secret`` (``secrets.token_urlsafe(32)``, 256 bits)
is what proves possession. Only the SHA-256 of the whole key is stored and it is compared in
constant time; the plaintext exists once, in ``create``'s return value, and is never stored or
logged. SHA-256 without a salt or a slow KDF is enough here because the secret is random and
long, not a password anyone could guess from a dictionary.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from titan.config.admission import Budget, Limits, Priority
from titan.errors import AuthenticationError, InvalidRequestError, StorageUnavailableError

if TYPE_CHECKING:  # annotations only: importing titan.storage loads the concrete stores
    from titan.storage.base import DocumentStore

NAMESPACE = "api_keys"
KEY_PREFIX = "sk-titan-"
KEY_ID_LENGTH = 12
# Bounds memory when many distinct keys authenticate; the least recently used entry goes first.
MAX_CACHED_KEYS = 10_000

_KEY_ID = re.compile(r"[0-9a-f]{12}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NO_HASH = "0" * 64  # matches no SHA-256 hex digest that hash_key returns in practice
_MALFORMED = (
    "API keys look like 'sk-titan-<12 hex characters>-<secret>'; the key given does not. "
    "Check that it was copied whole, and pass it as 'Authorization: Bearer <key>'."
)


class KeyPolicy(Limits):
    """What one key may do, on top of its tenant's limits: which models (empty: every one),
    ``rpm``/``tpm``/``max_concurrency`` (None: no own limit), its priority, when it expires
    (unix seconds; None: never) and its own spending cap."""

    models: tuple[str, ...] = ()
    priority: Priority = "normal"
    expires_at: float | None = None
    budget: Budget | None = None

    def allows_model(self, model: str) -> bool:
        return not self.models or model in self.models


class ApiKey(BaseModel):
    """One issued key as stored (``secret_hash``: hex SHA-256 of the whole key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    tenant: str
    name: str = ""
    secret_hash: str = Field(repr=False)
    created_at: float
    revoked_at: float | None = None
    policy: KeyPolicy = KeyPolicy()

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, now: float) -> bool:
        return self.policy.expires_at is not None and now >= self.policy.expires_at

    def public(self) -> dict[str, Any]:
        """Everything but the hash: for listings, the admin API and logs."""
        return self.model_dump(mode="json", exclude={"secret_hash"})


def validate_name(value: str, what: str = "tenant") -> str:
    """``value`` if it is a valid tenant or key name (1-64 of ``A-Z a-z 0-9 . _ -``)."""
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise InvalidRequestError(
            f"invalid {what} name {value!r}: use 1 to 64 letters, digits, '.', '_' or '-'",
            param=what,
        )
    return value


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_key_id(presented: str) -> str | None:
    """The key id of a well-formed key, else None. By position: the secret may contain '-'."""
    if not presented.startswith(KEY_PREFIX):
        return None
    rest = presented[len(KEY_PREFIX) :]
    key_id, dash, secret = rest[:KEY_ID_LENGTH], rest[KEY_ID_LENGTH:][:1], rest[KEY_ID_LENGTH + 1 :]
    if _KEY_ID.fullmatch(key_id) is None or dash != "-" or not secret:
        return None
    return key_id


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class KeyRing:
    """The API keys in ``documents`` (namespace ``api_keys``), with an in-process cache.

    ``authenticate`` caches what it fetched for ``cache_s`` seconds (per instance, at most
    ``MAX_CACHED_KEYS`` entries), so a revocation made elsewhere (another replica, the CLI)
    applies here within ``cache_s``; ``revoke`` on this instance applies here at once. Misses
    are not cached: a key created on another replica works at once, and requests with made-up
    key ids cannot evict the real entries.

    While the store is unreachable, a key fetched within ``stale_if_error_s`` is served from the
    cache (``on_stale`` is told); any other lookup raises StorageUnavailableError (503, never a
    401: the key may well be valid).
    """

    def __init__(
        self,
        documents: DocumentStore,
        *,
        now: Callable[[], float] = time.time,
        cache_s: float = 5.0,
        stale_if_error_s: float = 0.0,
        on_stale: Callable[[StorageUnavailableError], None] | None = None,
    ) -> None:
        self._documents = documents
        self._now = now
        self._cache_s = cache_s
        self._stale_if_error_s = stale_if_error_s
        self._on_stale = on_stale
        self._cache: OrderedDict[str, tuple[float, ApiKey]] = OrderedDict()

    async def create(
        self, tenant: str, *, name: str = "", policy: KeyPolicy | None = None
    ) -> tuple[str, ApiKey]:
        """Issue a key: ``(plaintext, record)``. The plaintext is not kept anywhere."""
        validate_name(tenant, "tenant")
        if name:  # "" leaves the key unnamed
            validate_name(name, "key")
        while True:  # 48 random bits: a clash is all but impossible, but never overwrite one
            key_id = secrets.token_hex(KEY_ID_LENGTH // 2)
            if await self._documents.get(NAMESPACE, key_id) is None:
                break
        plaintext = f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"
        record = ApiKey(
            key_id=key_id,
            tenant=tenant,
            name=name,
            secret_hash=hash_key(plaintext),
            created_at=self._now(),
            policy=policy if policy is not None else KeyPolicy(),
        )
        await self._documents.put(NAMESPACE, key_id, record.model_dump(mode="json"))
        return plaintext, record

    async def list(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key (revoked and expired included), or the tenant's; oldest first."""
        if tenant is not None:
            validate_name(tenant, "tenant")
        records = [ApiKey.model_validate(doc) for _, doc in await self._documents.list(NAMESPACE)]
        if tenant is not None:
            records = [record for record in records if record.tenant == tenant]
        return sorted(records, key=lambda record: (record.created_at, record.key_id))

    async def get(self, key_id: str) -> ApiKey | None:
        """The stored record, fresh from the store (not cached)."""
        doc = await self._documents.get(NAMESPACE, key_id)
        return None if doc is None else ApiKey.model_validate(doc)

    async def revoke(self, key_id: str) -> bool:
        """Revoke the key (kept, for listings and audit); False if there is no such key.
        Revoking again keeps the first revocation time."""
        record = await self.get(key_id)
        if record is None:
            return False
        self._cache.pop(key_id, None)
        if not record.is_revoked:
            revoked = record.model_copy(update={"revoked_at": self._now()})
            await self._documents.put(NAMESPACE, key_id, revoked.model_dump(mode="json"))
        return True

    async def has_keys(self) -> bool:
        """Whether any key was ever issued. Revoked keys count: revoking every key must not
        turn authentication off."""
        return bool(await self._documents.list(NAMESPACE))

    async def count(self) -> tuple[int, int]:
        """``(active, inactive)`` keys: what a server may say about its keys. Revoked, expired
        and unreadable records are inactive."""
        documents = await self._documents.list(NAMESPACE)
        now = self._now()
        active = 0
        for _, document in documents:
            try:
                record = ApiKey.model_validate(document)
            except ValidationError:
                continue
            active += not record.is_revoked and not record.is_expired(now)
        return active, len(documents) - active

    async def authenticate(self, presented: str) -> ApiKey:
        """The record of a valid key; AuthenticationError (401) saying why otherwise.

        Revoked and expired are told only after the secret matched, so guessing key ids
        reveals nothing about them.
        """
        presented = presented.strip()
        key_id = parse_key_id(presented)
        if key_id is None:
            raise AuthenticationError(_MALFORMED)
        record = await self._lookup(key_id)
        # Constant time, so response timing cannot tell how much of a guessed hash matched; a
        # dummy comparison for unknown ids keeps their timing like that of a wrong secret.
        expected = record.secret_hash if record is not None else _NO_HASH
        if not hmac.compare_digest(hash_key(presented), expected) or record is None:
            raise AuthenticationError(
                f"Incorrect API key (id {key_id}): no key with this id and secret was issued "
                "here. Check the key, or create one with `titan keys create`."
            )
        return self._still_valid(record)

    async def authenticate_id(self, key_id: str) -> ApiKey:
        """The record of a key that authenticated earlier (it submitted a job): still valid, or
        AuthenticationError saying why not."""
        record = await self._lookup(key_id)
        if record is None:
            raise AuthenticationError(f"The API key {key_id} no longer exists.")
        return self._still_valid(record)

    def _still_valid(self, record: ApiKey) -> ApiKey:
        if record.revoked_at is not None:
            raise AuthenticationError(
                f"The API key {record.key_id} was revoked on {_utc(record.revoked_at)}; ask for "
                "a new one."
            )
        now = self._now()
        if record.is_expired(now):
            raise AuthenticationError(
                f"The API key {record.key_id} expired on {_utc(record.policy.expires_at or now)}; "
                "ask for a new one."
            )
        return record

    async def _lookup(self, key_id: str) -> ApiKey | None:
        now = self._now()
        cached = self._cache.get(key_id)
        if cached is not None and now - cached[0] < self._cache_s:
            self._cache.move_to_end(key_id)
            return cached[1]
        try:
            record = await self.get(key_id)
        except StorageUnavailableError as exc:
            if cached is None or now - cached[0] >= self._stale_if_error_s:
                raise
            if self._on_stale is not None:
                self._on_stale(exc)
            return cached[1]  # its fetch time stays: it goes stale as if fetched then
        if record is None:
            self._cache.pop(key_id, None)
            return None
        if self._cache_s > 0:
            self._cache[key_id] = (now, record)
            self._cache.move_to_end(key_id)
            while len(self._cache) > MAX_CACHED_KEYS:
                self._cache.popitem(last=False)
        return record
