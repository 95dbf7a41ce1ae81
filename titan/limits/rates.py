"""Rate, token and concurrency limits: which buckets a request draws from, the all-or-nothing
reservation, OpenAI's x-ratelimit-* headers, and the settlement with actual usage.

A request reserves ``1`` from every requests/min bucket and its estimated tokens (prompt +
max_tokens) from every tokens/min bucket that applies to it (its key, its tenant, its model, or its
client IP without a key), plus a concurrency lease on every concurrency limit, in one atomic store
call. After the answer, the token buckets are settled with the actual usage.

Concurrency leases are short (``lease_ttl_s``, 30 s by default) and renewed while their request
runs: every ``lease_ttl_s / 3`` the limiter renews all of its live leases in one store call. A
replica that dies stops renewing, so its slots free themselves within ``lease_ttl_s`` however long
its requests would have run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from titan.config.admission import Limits
from titan.errors import RateLimitError
from titan.storage.base import Bucket, ConcurrencySlot, LimitStore, Settlement

logger = logging.getLogger("titan.limits")

SECONDS_PER_MINUTE = 60.0
DEFAULT_LEASE_TTL_S = 30.0


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


@dataclass(eq=False)  # identity: live reservations are kept in a WeakSet
class Reservation:
    """What a request holds while it runs: settle once with the actual tokens, then release."""

    store: LimitStore
    drawn: tuple[_Drawn, ...]
    slots: tuple[ConcurrencySlot, ...]
    lease_id: str
    reserved_tokens: int
    headers: dict[str, str]
    is_released: bool = False
    # The limiter's set of leases to renew; leaving it first means a release that fails still
    # frees the slots within one lease TTL.
    renewed_in: weakref.WeakSet[Reservation] | None = field(default=None, repr=False)

    async def finish(self, actual_tokens: int | None) -> None:
        """Settle the token buckets (None: the reservation stands) and free the slots."""
        if self.is_released:
            return
        self.is_released = True
        if self.renewed_in is not None:
            self.renewed_in.discard(self)
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
    """Reserves limits for requests and keeps their concurrency leases alive: ``start`` runs the
    renewal loop (every ``lease_ttl_s / 3``), ``close`` stops it."""

    def __init__(
        self, store: LimitStore, *, lease_ttl_s: float = DEFAULT_LEASE_TTL_S, prefix: str = "rl"
    ):
        if not lease_ttl_s > 0:
            raise ValueError(f"lease_ttl_s must be positive, not {lease_ttl_s}")
        self.store = store
        self.lease_ttl_s = lease_ttl_s
        self.prefix = prefix
        # Reservations holding slots, until finished. Weak: one that nobody can finish any more
        # (a leak) is dropped with its last reference, and its leases lapse instead of living on.
        self._held: weakref.WeakSet[Reservation] = weakref.WeakSet()
        self._renewer: asyncio.Task[None] | None = None

    @property
    def renew_interval_s(self) -> float:
        return self.lease_ttl_s / 3

    @property
    def num_held(self) -> int:
        """Reservations whose leases this limiter renews."""
        return len(self._held)

    async def renew_leases(self) -> int:
        """Renew every lease of the unfinished reservations in one store call; how many."""
        leases = [(slot, r.lease_id) for r in list(self._held) for slot in r.slots]
        if leases:
            await self.store.renew(leases, self.lease_ttl_s)
        return len(leases)

    def start(self) -> None:
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_periodically(), name="lease-renewal")

    async def close(self) -> None:
        """Stop renewing; leases still held lapse within ``lease_ttl_s``."""
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _renew_periodically(self) -> None:
        is_failing = False
        while True:
            await asyncio.sleep(self.renew_interval_s)
            try:
                await self.renew_leases()
            except Exception:  # the store is down: keep trying; one log line per outage
                if not is_failing:
                    logger.exception(
                        "renewing concurrency leases failed; retrying every %.1f s (leases "
                        "lapse %.0f s after their last renewal)",
                        self.renew_interval_s,
                        self.lease_ttl_s,
                    )
                is_failing = True
                continue
            if is_failing:
                logger.info("renewing concurrency leases works again")
                is_failing = False

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
            reservation = Reservation(
                self.store, tuple(drawn), tuple(s for _, s in slots), lease_id, tokens, headers
            )
            if slots:
                reservation.renewed_in = self._held
                self._held.add(reservation)
            return reservation
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
