"""What shared state needs from a store: documents, counters, and atomic limit buckets.

``limits``, ``cache``, ``context`` and ``jobs`` use these protocols, never a concrete store. Three
stores implement them: memory (one process), SQLite (durable documents and counters; limits in
memory, since one process owns them) and Redis (everything, shared by replicas).

Limit semantics (the same bits in every store):

- A **token bucket** holds at most ``capacity`` tokens and refills continuously at
  ``refill_per_s``; a bucket never seen is full. ``requests/min = 60`` is a bucket of capacity 60
  refilling at 1/s; each request costs 1. ``tokens/min`` buckets cost the reserved tokens.
- ``acquire`` is all or nothing: it refills every bucket to ``now``, and only if every bucket holds
  at least its ``cost`` and every concurrency key has fewer than ``limit`` live leases does it take
  the costs and add a lease (``lease_id``, live until ``lease_expires_at`` or ``release``).
  Otherwise it changes nothing and says which bucket or concurrency key refused first and when a
  retry could succeed.
- ``settle`` adds ``delta`` tokens to a bucket after the fact (positive: refund an over-estimate;
  negative: charge actual usage beyond the reservation, possibly below zero, which is debt the
  refill pays back). The result is capped at ``capacity``.
- Time is the store's: the memory store's injected clock, Redis's ``TIME`` (one clock for every
  replica).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Bucket:
    """One token bucket to draw ``cost`` from."""

    key: str
    capacity: float
    refill_per_s: float
    cost: float


@dataclass(frozen=True)
class ConcurrencySlot:
    """One concurrency limit: at most ``limit`` live leases under ``key``."""

    key: str
    limit: int


@dataclass(frozen=True)
class Acquisition:
    """What ``acquire`` decided.

    ``remaining``: each bucket's tokens after the decision, in the order given (whether or not it
    admitted), for x-ratelimit-remaining-* headers. ``refused_bucket`` / ``refused_slot``: the
    index of the first bucket or slot that refused (None when admitted). ``retry_after_s``: for a
    refused bucket, the seconds until it holds its cost (inf when the cost exceeds its capacity);
    for a refused slot, None (it frees when a request ends).
    """

    is_admitted: bool
    remaining: tuple[float, ...] = ()
    refused_bucket: int | None = None
    refused_slot: int | None = None
    retry_after_s: float | None = None
    now: float = 0.0


@dataclass(frozen=True)
class Settlement:
    bucket: Bucket  # its ``cost`` is ignored
    delta: float


class LimitStore(Protocol):
    async def acquire(
        self,
        buckets: Sequence[Bucket],
        slots: Sequence[ConcurrencySlot] = (),
        *,
        lease_id: str = "",
        lease_ttl_s: float = 600.0,
    ) -> Acquisition: ...

    async def settle(self, settlements: Sequence[Settlement]) -> None: ...

    async def release(self, slots: Sequence[ConcurrencySlot], lease_id: str) -> None: ...

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[float, ...]:
        """Each bucket's tokens now (refilled), changing nothing."""
        ...


class DocumentStore(Protocol):
    """JSON documents (dicts of JSON values) by namespace and id."""

    async def put(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> None: ...

    async def get(self, namespace: str, doc_id: str) -> dict[str, Any] | None: ...

    async def put_if(
        self, namespace: str, doc_id: str, doc: Mapping[str, Any], *, expected: str | None
    ) -> bool:
        """Atomically write ``doc`` only if the stored document's ``"_version"`` field equals
        ``expected`` (None: only if no document is stored); returns whether it wrote. A stored
        document without a string ``"_version"`` matches no ``expected`` but None never does."""
        ...

    async def delete(self, namespace: str, doc_id: str) -> bool: ...

    async def list(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """Every (id, document) in the namespace, in id order."""
        ...


def version_matches(current: Mapping[str, Any] | None, expected: str | None) -> bool:
    """``put_if``'s condition, for stores that check it in Python."""
    if current is None or expected is None:
        return current is None and expected is None
    version = current.get("_version")
    return isinstance(version, str) and version == expected


@dataclass(frozen=True)
class Increment:
    counter_id: str
    amounts: Mapping[str, float]
    ttl_s: float | None = None


class CounterStore(Protocol):
    """Named numeric fields per (namespace, id), incremented atomically (usage accounting)."""

    async def increment_many(self, namespace: str, increments: Sequence[Increment]) -> None:
        """Several increments in one round trip (one transaction where the store has them)."""
        ...

    async def increment(
        self,
        namespace: str,
        counter_id: str,
        amounts: Mapping[str, float],
        *,
        ttl_s: float | None = None,
    ) -> None: ...

    async def read(self, namespace: str, counter_id: str) -> dict[str, float]: ...

    async def scan(self, namespace: str, prefix: str = "") -> list[tuple[str, dict[str, float]]]:
        """Every (id, fields) whose id starts with ``prefix``, in id order."""
        ...


@dataclass(frozen=True)
class CacheEntry:
    """One cached answer. ``tags``: what flushes select on and the semantic index needs (tenant,
    model, scope, the query text); ``embedding``: float32 bytes for semantic entries."""

    key: str
    value: bytes
    created_at: float  # unix seconds
    expires_at: float  # unix seconds
    tags: Mapping[str, str] = field(default_factory=dict)
    embedding: bytes | None = None

    @property
    def num_bytes(self) -> int:
        return len(self.value) + len(self.embedding or b"") + len(self.key)


class CacheStore(Protocol):
    """Cached answers by namespace ("exact", "semantic") and key, with a TTL per entry and a cap
    on entries per namespace that evicts the least recently used. Time is wall-clock (unix
    seconds; the memory store's clock is injectable), shared by replicas."""

    async def get(self, namespace: str, key: str) -> CacheEntry | None:
        """The live entry (not expired), marking it recently used; None otherwise."""
        ...

    async def put(self, namespace: str, entry: CacheEntry, *, max_entries: int) -> list[str]:
        """Store (or replace) the entry, then evict least recently used entries until at most
        ``max_entries`` remain; returns the evicted keys."""
        ...

    async def delete(self, namespace: str, key: str) -> bool: ...

    async def flush(
        self, namespace: str, *, tenant: str | None = None, model: str | None = None
    ) -> int:
        """Delete every entry whose tags match (None: any); returns how many."""
        ...

    async def added_since(
        self, namespace: str, since: float, *, limit: int = 10_000
    ) -> list[CacheEntry]:
        """Live entries created after ``since``, oldest first (a semantic index follows the
        shared entries with this, and rebuilds itself with ``since=0``)."""
        ...

    async def stats(self, namespace: str) -> dict[str, int]:
        """``{"entries": n, "bytes": b}`` of the live entries."""
        ...


@dataclass
class Storage:
    """The stores one ``storage:`` URL opens; ``close`` releases their connections."""

    url: str
    documents: DocumentStore
    counters: CounterStore
    limits: LimitStore
    cache: CacheStore | None = None  # None until a store for cached answers is opened
    closers: list[Any] = field(default_factory=list)

    async def close(self) -> None:
        for close in self.closers:
            await close()
