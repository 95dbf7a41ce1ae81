"""Key management and usage reports behind the HTTP admin API (``/admin/*``, ``/v1/usage``).

The admin API needs the master key (``auth.master_key``); it is off when none is configured.
``/v1/usage`` shows a key its own usage (everything, when auth is off).
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from pydantic import Field

from titan.cache.response_cache import ResponseCache
from titan.config import Settings
from titan.config.admission import Budget, Priority
from titan.errors import AuthenticationError, InvalidRequestError, NotFoundError
from titan.limits.keys import KeyPolicy
from titan.limits.usage import Granularity, UsageLedger
from titan.limits.usage_buffer import UsageBuffer
from titan.protocol.common import validated
from titan.service.authentication import Authenticator


class CreateKeyBody(Settings):
    tenant: str
    name: str = ""
    models: tuple[str, ...] = ()
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)
    priority: Priority = "normal"
    expires_at: float | None = None  # unix seconds
    expires_in_s: float | None = Field(None, gt=0)
    budget: Budget | None = None


class AdminService:
    def __init__(
        self,
        auth: Authenticator,
        usage: UsageLedger,
        pending_usage: UsageBuffer,
        cache: ResponseCache | None = None,
    ):
        self.auth = auth
        self.usage_ledger = usage
        self.pending_usage = pending_usage
        self.cache = cache

    def check_master_key(self, presented: str | None) -> None:
        master = self.auth.config.auth.master_key
        if master is None:
            raise NotFoundError(
                "The admin API is off: set auth.master_key (e.g. '${TITAN_MASTER_KEY}') in the "
                "config to turn it on."
            )
        expected = master.get_secret_value().encode()
        if presented is None or not hmac.compare_digest(presented.encode(), expected):
            raise AuthenticationError(
                "The admin API needs the master key: 'Authorization: Bearer <master key>'.",
                code="invalid_master_key",
            )

    async def create_key(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = validated(CreateKeyBody, body)
        expires_at = asked.expires_at
        if asked.expires_in_s is not None:
            expires_at = time.time() + asked.expires_in_s
        policy = KeyPolicy(
            models=asked.models,
            rpm=asked.rpm,
            tpm=asked.tpm,
            max_concurrency=asked.max_concurrency,
            priority=asked.priority,
            expires_at=expires_at,
            budget=asked.budget,
        )
        plaintext, record = await self.auth.keys.create(
            asked.tenant, name=asked.name, policy=policy
        )
        self.auth.enable()
        return {"key": plaintext, **record.public()}

    async def list_keys(self, tenant: str | None) -> list[dict[str, Any]]:
        return [key.public() for key in await self.auth.keys.list(tenant)]

    async def revoke_key(self, key_id: str) -> dict[str, Any]:
        if not await self.auth.keys.revoke(key_id):
            raise NotFoundError(f"No API key with id '{key_id}'.", param="key_id")
        return {"id": key_id, "revoked": True}

    async def cache_stats(self) -> dict[str, Any]:
        return {"object": "cache.stats", **(await self._cache().stats())}

    async def flush_cache(self, tenant: str | None, model: str | None) -> dict[str, Any]:
        removed = await self._cache().flush(tenant=tenant, model=model)
        return {"object": "cache.flush", "tenant": tenant, "model": model, "deleted": removed}

    def _cache(self) -> ResponseCache:
        if self.cache is None:
            raise NotFoundError("The response cache is not running.")
        return self.cache

    async def usage(
        self,
        scope: str | None,
        granularity: str,
        start: float | None,
        end: float | None,
    ) -> dict[str, Any]:
        if granularity not in ("hour", "day", "month", "total"):
            raise InvalidRequestError(
                f"Invalid granularity {granularity!r}: use hour, day, month or total.",
                param="granularity",
            )
        await self.pending_usage.flush()
        rows = await self.usage_ledger.report(scope, _granularity(granularity), start, end)
        return {"object": "list", "granularity": granularity, "data": rows}

    async def own_usage(
        self, api_key: str | None, granularity: str, start: float | None, end: float | None
    ) -> dict[str, Any]:
        await self.auth.refresh()
        if not self.auth.is_auth_on:
            return await self.usage("all", granularity, start, end)
        key = await self.auth.key(api_key)
        return await self.usage(f"key:{key.key_id}", granularity, start, end)


def _granularity(value: str) -> Granularity:
    return value  # type: ignore[return-value]  # checked by the caller


def parse_time(value: str | None, name: str) -> float | None:
    """Query parameters ``start``/``end``: unix seconds."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise InvalidRequestError(
            f"Invalid '{name}' {value!r}: give unix seconds, e.g. {int(time.time())}.", param=name
        ) from None
