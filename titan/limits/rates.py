"""Rate, token and concurrency limits: which buckets a request draws from, the all-or-nothing
reservation, OpenAI's x-ratelimit-* headers, and the settlement with actual usage.

A request reserves ``1`` from every requests/min bucket and its estimated tokens (prompt +
max_tokens) from every tokens/min bucket that applies to it (its key, its tenant, its model, or its
client IP without a key), plus a concurrency lease on every concurrency limit, in one atomic store
call. After the answer, the token buckets are settled with the actual usage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from titan.config.admission import Limits
from titan.errors import RateLimitError
from titan.storage.base import Bucket, ConcurrencySlot, LimitStore, Settlement

SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True)
class Scope:
    """One subject that limits apply to: ``kind`` names it in messages ("key", "tenant",
    "model", "client"), ``ident`` keys its store entries."""

    kind: str
    ident: str
    limits: Limits

    @property
    def label(self) -> str:
        return f"{self.kind} '{self.ident}'"


@dataclass(frozen=True)
class _Drawn:
    scope: Scope
    kind: str  # "requests" or "tokens"
    bucket: Bucket


def format_reset(seconds: float) -> str:
    """OpenAI's reset durations: ``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1h2m3s"``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _headers(drawn: Sequence[_Drawn], remaining: Sequence[float]) -> dict[str, str]:
    """For requests and for tokens, the tightest bucket (least remaining) speaks for all."""
    headers: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        pairs = [(d, r) for d, r in zip(drawn, remaining, strict=True) if d.kind == kind]
        if not pairs:
            continue
        tightest, left = min(pairs, key=lambda pair: pair[1])
        bucket = tightest.bucket
        headers[f"x-ratelimit-limit-{kind}"] = str(int(bucket.capacity))
        headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(left)))
        refill_s = (bucket.capacity - left) / bucket.refill_per_s
        headers[f"x-ratelimit-reset-{kind}"] = format_reset(max(0.0, refill_s))
    return headers


@dataclass
class Reservation:
    """What a request holds while it runs: settle once with the actual tokens, then release."""

    store: LimitStore
    drawn: tuple[_Drawn, ...]
    slots: tuple[ConcurrencySlot, ...]
    lease_id: str
    reserved_tokens: int
    headers: dict[str, str]
    is_released: bool = False

    async def finish(self, actual_tokens: int | None) -> None:
        """Settle the token buckets (None: the reservation stands) and free the slots."""
        if self.is_released:
            return
        self.is_released = True
        try:
            if actual_tokens is not None and actual_tokens != self.reserved_tokens:
                delta = float(self.reserved_tokens - actual_tokens)
                settlements = [
                    Settlement(d.bucket, delta) for d in self.drawn if d.kind == "tokens"
                ]
                if settlements:  # no tokens/min limit drawn: nothing to ask the store
                    await self.store.settle(settlements)
        finally:  # a failed settlement must not hold the slots until their lease expires
            if self.slots:
                await self.store.release(self.slots, self.lease_id)


class RateLimiter:
    def __init__(self, store: LimitStore, *, lease_ttl_s: float = 900.0, prefix: str = "rl"):
        self.store = store
        self.lease_ttl_s = lease_ttl_s
        self.prefix = prefix

    def _draws(self, scopes: Sequence[Scope], tokens: int) -> list[_Drawn]:
        drawn = []
        for scope in scopes:
            base = f"{self.prefix}:{scope.kind}:{scope.ident}"
            if scope.limits.rpm is not None:
                rpm = float(scope.limits.rpm)
                bucket = Bucket(f"{base}:rpm", rpm, rpm / SECONDS_PER_MINUTE, 1.0)
                drawn.append(_Drawn(scope, "requests", bucket))
            if scope.limits.tpm is not None:
                tpm = float(scope.limits.tpm)
                bucket = Bucket(f"{base}:tpm", tpm, tpm / SECONDS_PER_MINUTE, float(tokens))
                drawn.append(_Drawn(scope, "tokens", bucket))
        return drawn

    def _slots(self, scopes: Sequence[Scope]) -> list[tuple[Scope, ConcurrencySlot]]:
        return [
            (s, ConcurrencySlot(f"{self.prefix}:{s.kind}:{s.ident}:conc", s.limits.max_concurrency))
            for s in scopes
            if s.limits.max_concurrency is not None
        ]

    async def reserve(self, scopes: Sequence[Scope], tokens: int, lease_id: str) -> Reservation:
        """Take 1 request and ``tokens`` tokens from every applicable bucket and a lease on every
        concurrency limit, or raise RateLimitError (429, Retry-After, x-ratelimit-* headers)
        naming the limit that refused."""
        drawn = self._draws(scopes, tokens)
        for d in drawn:
            if d.kind == "tokens" and d.bucket.cost > d.bucket.capacity:
                raise RateLimitError(
                    f"Request too large for the {d.scope.label}: it may use up to {tokens} "
                    f"tokens (prompt + max_tokens) and its limit is {int(d.bucket.capacity)} "
                    "tokens per minute. Lower max_tokens or shorten the prompt.",
                    code="tokens_exceeded",
                )
        slots = self._slots(scopes)
        if not drawn and not slots:  # no limit applies: nothing to ask the store
            return Reservation(self.store, (), (), lease_id, tokens, {})
        decision = await self.store.acquire(
            [d.bucket for d in drawn],
            [slot for _, slot in slots],
            lease_id=lease_id,
            lease_ttl_s=self.lease_ttl_s,
        )
        headers = _headers(drawn, decision.remaining)
        if decision.is_admitted:
            return Reservation(
                self.store, tuple(drawn), tuple(s for _, s in slots), lease_id, tokens, headers
            )
        if decision.refused_bucket is not None:
            d = drawn[decision.refused_bucket]
            per = "requests" if d.kind == "requests" else "tokens"
            left = max(0, math.floor(decision.remaining[decision.refused_bucket]))
            message = (
                f"Rate limit reached for the {d.scope.label}: limit {int(d.bucket.capacity)} "
                f"{per} per minute, {left} left, this request needs {int(d.bucket.cost)}. "
                f"Retry after {format_reset(decision.retry_after_s or 0.0)}."
            )
            code = "rate_limit_exceeded" if d.kind == "requests" else "tokens_exceeded"
        else:
            scope, slot = slots[decision.refused_slot or 0]
            message = (
                f"Too many concurrent requests for the {scope.label}: at most {slot.limit} at "
                "once. Retry when one of them has finished."
            )
            code = "concurrency_exceeded"
        error = RateLimitError(message, retry_after=decision.retry_after_s or 1.0, code=code)
        error.headers = headers
        raise error
