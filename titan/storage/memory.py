"""In-process stores: one event loop owns them, so a method with no ``await`` between its check
and its update is atomic. The limit arithmetic here is the reference the Redis scripts mirror."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from titan.storage.base import (
    Acquisition,
    Bucket,
    ConcurrencySlot,
    Increment,
    Settlement,
    version_matches,
)

# Idle state is dropped every this many acquires, so per-client keys (one bucket per IP) cannot
# grow without bound; amortized O(1) per acquire.
SWEEP_EVERY = 4096


def refilled(tokens: float, ts: float, now: float, capacity: float, refill_per_s: float) -> float:
    """A bucket's tokens at ``now``; the Redis scripts compute exactly this, in the same order."""
    return min(capacity, tokens + max(0.0, now - ts) * refill_per_s)


def retry_after(level: float, bucket: Bucket) -> float:
    """Seconds until a bucket at ``level`` holds its cost; inf when it never will."""
    if bucket.cost > bucket.capacity or bucket.refill_per_s <= 0:
        return math.inf
    return (bucket.cost - level) / bucket.refill_per_s


@dataclass
class _BucketState:
    tokens: float
    ts: float
    capacity: float
    refill_per_s: float


class MemoryLimits:
    """Token buckets and concurrency leases in one process; ``now`` is the store's clock."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._buckets: dict[str, _BucketState] = {}
        # key -> lease_id -> expires_at
        self._leases: dict[str, dict[str, float]] = {}
        self._num_acquires = 0

    def _level(self, bucket: Bucket, now: float) -> float:
        state = self._buckets.get(bucket.key)
        if state is None:
            return bucket.capacity  # a bucket never seen (or swept because full) is full
        return refilled(state.tokens, state.ts, now, bucket.capacity, bucket.refill_per_s)

    def _store(self, bucket: Bucket, tokens: float, now: float) -> None:
        self._buckets[bucket.key] = _BucketState(tokens, now, bucket.capacity, bucket.refill_per_s)

    def _live_leases(self, key: str, now: float) -> dict[str, float]:
        leases = self._leases.setdefault(key, {})
        expired = [lease_id for lease_id, expires_at in leases.items() if expires_at <= now]
        for lease_id in expired:
            del leases[lease_id]
        return leases

    async def acquire(
        self,
        buckets: Sequence[Bucket],
        slots: Sequence[ConcurrencySlot] = (),
        *,
        lease_id: str = "",
        lease_ttl_s: float = 600.0,
    ) -> Acquisition:
        if slots and not lease_id:
            raise ValueError("acquire with concurrency slots needs a lease_id to release")
        now = self._now()
        self._num_acquires += 1
        if self._num_acquires % SWEEP_EVERY == 0:
            self._sweep(now)
        levels = [self._level(bucket, now) for bucket in buckets]
        for i, (bucket, level) in enumerate(zip(buckets, levels, strict=True)):
            if level < bucket.cost:
                return Acquisition(
                    is_admitted=False,
                    remaining=tuple(levels),
                    refused_bucket=i,
                    retry_after_s=retry_after(level, bucket),
                    now=now,
                )
        for j, slot in enumerate(slots):
            if len(self._live_leases(slot.key, now)) >= slot.limit:
                return Acquisition(False, tuple(levels), refused_slot=j, now=now)
        remaining = []
        for bucket, level in zip(buckets, levels, strict=True):
            self._store(bucket, level - bucket.cost, now)
            remaining.append(level - bucket.cost)
        for slot in slots:
            self._leases[slot.key][lease_id] = now + lease_ttl_s
        return Acquisition(True, tuple(remaining), now=now)

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        now = self._now()
        for settlement in settlements:
            bucket = settlement.bucket
            level = self._level(bucket, now)
            self._store(bucket, min(bucket.capacity, level + settlement.delta), now)

    async def release(self, slots: Sequence[ConcurrencySlot], lease_id: str) -> None:
        for slot in slots:
            leases = self._leases.get(slot.key)
            if leases is not None:
                leases.pop(lease_id, None)

    async def renew(
        self, leases: Sequence[tuple[ConcurrencySlot, str]], lease_ttl_s: float
    ) -> None:
        now = self._now()
        for slot, lease_id in leases:
            held = self._leases.get(slot.key)
            # Only a live lease is extended: a released or expired one stays gone.
            if held is not None and held.get(lease_id, now) > now:
                held[lease_id] = now + lease_ttl_s

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[float, ...]:
        now = self._now()
        return tuple(self._level(bucket, now) for bucket in buckets)

    def _sweep(self, now: float) -> None:
        """Forget full buckets (a missing bucket is full) and keys without live leases."""
        full = [
            key
            for key, s in self._buckets.items()
            if refilled(s.tokens, s.ts, now, s.capacity, s.refill_per_s) >= s.capacity
        ]
        for key in full:
            del self._buckets[key]
        for key in list(self._leases):
            if not self._live_leases(key, now):
                del self._leases[key]


class MemoryDocuments:
    """Documents kept as JSON bytes, so callers get copies and non-JSON values fail here as they
    would in SQLite or Redis."""

    def __init__(self) -> None:
        self._docs: dict[str, dict[str, bytes]] = {}

    async def put(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> None:
        self._docs.setdefault(namespace, {})[doc_id] = orjson.dumps(doc)

    async def namespaces(self) -> list[str]:
        """Every namespace holding a document (``titan storage reseal`` walks them)."""
        return sorted(namespace for namespace, docs in self._docs.items() if docs)

    async def get(self, namespace: str, doc_id: str) -> dict[str, Any] | None:
        raw = self._docs.get(namespace, {}).get(doc_id)
        return None if raw is None else orjson.loads(raw)

    async def put_if(
        self, namespace: str, doc_id: str, doc: Mapping[str, Any], *, expected: str | None
    ) -> bool:
        # No await between the check and the write: atomic on one event loop.
        raw = self._docs.get(namespace, {}).get(doc_id)
        current = None if raw is None else orjson.loads(raw)
        if not version_matches(current, expected):
            return False
        self._docs.setdefault(namespace, {})[doc_id] = orjson.dumps(doc)
        return True

    async def delete(self, namespace: str, doc_id: str) -> bool:
        return self._docs.get(namespace, {}).pop(doc_id, None) is not None

    async def list(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        docs = self._docs.get(namespace, {})
        return [(doc_id, orjson.loads(docs[doc_id])) for doc_id in sorted(docs)]


@dataclass
class _Counter:
    fields: dict[str, float]
    expires_at: float | None


class MemoryCounters:
    """Counters per (namespace, id); ``ttl_s`` (re)sets the whole counter's expiry, like Redis
    EXPIRE on its hash, and an increment without one keeps the current expiry."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._counters: dict[str, dict[str, _Counter]] = {}

    def _live(self, namespace: str, counter_id: str, now: float) -> _Counter | None:
        counters = self._counters.get(namespace, {})
        counter = counters.get(counter_id)
        if counter is not None and counter.expires_at is not None and counter.expires_at <= now:
            del counters[counter_id]
            return None
        return counter

    async def increment(
        self,
        namespace: str,
        counter_id: str,
        amounts: Mapping[str, float],
        *,
        ttl_s: float | None = None,
    ) -> None:
        now = self._now()
        counter = self._live(namespace, counter_id, now)
        if counter is None:
            counter = _Counter({}, None)
            self._counters.setdefault(namespace, {})[counter_id] = counter
        for name, amount in amounts.items():
            counter.fields[name] = counter.fields.get(name, 0.0) + float(amount)
        if ttl_s is not None:
            counter.expires_at = now + ttl_s

    async def increment_many(self, namespace: str, increments: Sequence[Increment]) -> None:
        for item in increments:
            await self.increment(namespace, item.counter_id, item.amounts, ttl_s=item.ttl_s)

    async def read(self, namespace: str, counter_id: str) -> dict[str, float]:
        counter = self._live(namespace, counter_id, self._now())
        return {} if counter is None else dict(counter.fields)

    async def scan(self, namespace: str, prefix: str = "") -> list[tuple[str, dict[str, float]]]:
        now = self._now()
        ids = sorted(i for i in self._counters.get(namespace, {}) if i.startswith(prefix))
        found = []
        for counter_id in ids:
            counter = self._live(namespace, counter_id, now)
            if counter is not None:
                found.append((counter_id, dict(counter.fields)))
        return found
