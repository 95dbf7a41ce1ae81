"""Authentication: whether this server needs API keys, whose key a caller presents, and its
priority class (``Authenticator.caller``).

Auth is on as soon as any key exists in the storage (made by ``titan keys create``, through
``/admin/keys`` or by another replica; revoked keys count, so revoking every key never opens the
server), or on a non-loopback address with a master key. A key made by another command on the
same storage turns auth on for a user who never asked for keys, so every 401 says why auth is on
and in which storage the keys are; of the keys themselves it says only how many are active.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import ip_address

from titan.config import TitanConfig
from titan.config.admission import PRIORITIES, Priority
from titan.config.summary import shown_url
from titan.errors import AuthenticationError, InvalidRequestError, StorageUnavailableError
from titan.limits.keys import ApiKey, KeyRing, parse_key_id
from titan.protocol import ClientRequest
from titan.service.storage_health import StorageHealth
from titan.storage.base import Storage

logger = logging.getLogger("titan.auth")

# A 401 says how many keys are active; counting lists every key, so at most this often.
COUNT_INTERVAL_S = 5.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Caller:
    """Who is asking: the key (None while auth is off), the address and the priority class."""

    key: ApiKey | None
    client_host: str | None
    priority: Priority

    @property
    def tenant(self) -> str | None:
        return self.key.tenant if self.key is not None else None


class Authenticator:
    def __init__(
        self,
        config: TitanConfig,
        storage: Storage,
        storage_health: StorageHealth,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self._now = now
        self._health = storage_health
        self._store = shown_url(config.storage)
        self.keys = KeyRing(
            storage.documents,
            cache_s=config.auth.key_cache_s,
            stale_if_error_s=config.auth.key_stale_if_error_s,
            on_stale=lambda exc: storage_health.failed(
                "auth", exc, action="accepts keys validated recently here, refuses others (503)"
            ),
        )
        self.is_auth_on = False
        self._checked_at = -math.inf
        self._counted: tuple[float, int] | None = None  # (when, active keys)

    async def start(self) -> None:
        """Refuses to serve a non-loopback address without keys unless the config allows it or
        has a master key (then every request needs a key, the first made through /admin/keys);
        logs the storage and whether auth is on, and why."""
        await self.refresh()
        host = self.config.server.host
        auth = self.config.auth
        is_open = not self.is_auth_on and not auth.allow_unauthenticated
        if is_open and not is_loopback(host) and auth.master_key is not None:
            # A fresh deployment: its first key comes through /admin/keys; until then nobody
            # else gets in (rather than refusing to start, which would crash-loop the pods).
            self.is_auth_on = True
        elif is_open and not is_loopback(host):
            raise AuthenticationError(
                f"Refusing to serve {host} without API keys: create one with "
                f"`titan keys create --tenant NAME --storage {self._store}`, or set "
                "auth.allow_unauthenticated: true (flag --allow-unauthenticated) to serve it "
                "open.",
                code="auth_required",
            )
        logger.info("storage %s; %s", self._store, await self._state())

    async def _state(self) -> str:
        if not self.is_auth_on:
            return f"auth off: no API keys in this storage, anyone who reaches {self.host} may call"
        try:
            active, inactive = await self.keys.count()
        except StorageUnavailableError:
            return "auth on (the keys could not be counted: the storage is unreachable)"
        if active == 0 and inactive == 0:
            return "auth on: auth.master_key is set and no key exists yet (make one: /admin/keys)"
        return f"auth on: {_keys(active)} active ({inactive} revoked or expired)"

    @property
    def host(self) -> str:
        return f"{self.config.server.host}:{self.config.server.port}"

    def enable(self) -> None:
        """A key was just made here: this replica enforces keys from now on."""
        self.is_auth_on = True

    async def refresh(self, presented: str | None = None) -> None:
        """Auth turns on as soon as a key exists (created here, by the CLI or another replica):
        checked every ``auth.key_cache_s``, and at once when a caller presents a Titan key, so
        that its first requests are its own, not anonymous ones it could not see again."""
        if self.is_auth_on:
            return
        now = self._now()
        is_titan_key = presented is not None and parse_key_id(presented.strip()) is not None
        if now - self._checked_at < self.config.auth.key_cache_s and not is_titan_key:
            return
        self._checked_at = now
        self.is_auth_on = await self.keys.has_keys()

    async def key_of(self, request: ClientRequest) -> ApiKey | None:
        """The caller's key record; None when auth is off. 401 or 503 otherwise."""
        try:
            await self.refresh(request.api_key)
            if not self.is_auth_on:
                return None
            if request.key_id is not None:  # a job of a key that authenticated when submitted
                return await self.keys.authenticate_id(request.key_id)
            return await self.key(request.api_key)
        except StorageUnavailableError as exc:  # fail closed: 503, never 401
            self._health.failed("auth", exc, action="refuses keys not validated recently")
            raise

    async def caller(self, request: ClientRequest) -> Caller:
        key = await self.key_of(request)
        return Caller(key, request.client_host, self._priority(request, key))

    def _priority(self, request: ClientRequest, key: ApiKey | None) -> Priority:
        asked = request.headers.get("x-titan-priority")
        own = key.policy.priority if key is not None else None
        if asked is None:
            return own or self.config.admission.default_priority
        allowed = own or "interactive"
        if asked not in PRIORITIES:
            raise InvalidRequestError(
                f"Invalid x-titan-priority header {asked!r}: use one of {', '.join(PRIORITIES)}."
            )
        # A key may lower its class, never raise it above its policy's.
        return max(asked, allowed, key=PRIORITIES.index)  # type: ignore[return-value]

    async def identify(self, api_key: str | None) -> tuple[str, str | None]:
        """(tenant, key id) of a caller; ("", None) when auth is off (one user)."""
        try:
            await self.refresh(api_key)
            if not self.is_auth_on:
                return "", None
            key = await self.key(api_key)
        except StorageUnavailableError as exc:  # fail closed: 503, never 401
            self._health.failed("auth", exc, action="refuses keys not validated recently")
            raise
        return key.tenant, key.key_id

    async def tenant_for(self, api_key: str | None) -> str:
        """The tenant whose stored objects (responses, files, state) a caller may touch: its
        key's, or "" when auth is off."""
        return (await self.identify(api_key))[0]

    async def key(self, presented: str | None) -> ApiKey:
        """The record of a presented key (auth on); a 401 that says why otherwise."""
        if not presented:
            raise AuthenticationError(
                f"You didn't provide an API key, and this server needs one: {await self._why()} "
                "Send it as 'Authorization: Bearer KEY' (the openai SDK's api_key).",
                code="missing_api_key",
            )
        try:
            return await self.keys.authenticate(presented)
        except AuthenticationError as exc:
            raise AuthenticationError(f"{exc.message} {await self._why()}", code=exc.code) from None

    async def _why(self) -> str:
        """Why auth is on, for 401s: how many keys are active in which storage."""
        now = self._now()
        if self._counted is None or now - self._counted[0] >= COUNT_INTERVAL_S:
            try:
                self._counted = (now, (await self.keys.count())[0])
            except StorageUnavailableError:
                return f"its API keys are in {self._store}."
        active = self._counted[1]
        if active == 0 and self.config.auth.master_key is not None:
            return (
                f"auth.master_key is set and {self._store} holds no active API key yet; "
                "the master key makes one through POST /admin/keys."
            )
        return (
            f"it has {_keys(active)} active in {self._store} (keys turn auth on for every server "
            "on that storage; `titan keys list` shows them)."
        )


def _keys(count: int) -> str:
    return f"{count} API key{'' if count == 1 else 's'}"
