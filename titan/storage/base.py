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
  the costs and add a lease (``lease_id``, live for ``lease_ttl_s`` unless renewed, or until
  ``release``).
  Otherwise it changes nothing and says which bucket or concurrency key refused first and when a
  retry could succeed.
- ``renew`` pushes the expiry of each given lease that is still live to ``now + lease_ttl_s``. A
  lease already released or expired stays gone (Redis: ``ZADD XX`` after purging the expired), so
  a late renewal never takes a slot back. Owners renew their running requests' leases every
  ``lease_ttl_s / 3``; a dead owner's leases lapse within ``lease_ttl_s``.
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

    async def renew(
        self, leases: Sequence[tuple[ConcurrencySlot, str]], lease_ttl_s: float
    ) -> None:
        """Extend each live (slot, lease_id) to ``now + lease_ttl_s``, in one round trip."""
        ...

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


# Job states. Final ones never change again; "dead_letter": every attempt failed on a retryable
# error; "failed": an error retrying cannot fix (the request itself is wrong).
JOB_STATES = ("queued", "running", "succeeded", "failed", "dead_letter", "cancelled", "expired")
FINAL_JOB_STATES = frozenset(("succeeded", "failed", "dead_letter", "cancelled", "expired"))


@dataclass
class Job:
    """A unit of queued work. ``payload`` is opaque to the queue (the jobs layer's JSON)."""

    id: str
    tenant: str
    payload: dict[str, Any]
    priority: int = 0  # lower runs first
    state: str = "queued"
    attempts: int = 0  # claims so far, the running one included
    max_attempts: int = 3
    idempotency_key: str | None = None
    batch_id: str | None = None
    created_at: float = 0.0
    run_at: float = 0.0  # not before (a retry's backoff)
    deadline: float | None = None  # not started by then: expired
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None  # the lease holder while running
    lease_until: float | None = None
    is_cancel_requested: bool = False
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    result_ttl_s: float | None = None  # how long a finished job is kept (None: for good)
    expires_at: float | None = None  # set when it finishes: dropped after this

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES


class JobQueue(Protocol):
    """A durable queue of jobs with leases: at least once across crashes, results stored once.

    A worker claims jobs (a lease until ``lease_until``) and renews the lease while it runs
    them; a job whose lease runs out (its worker died) is claimed again. Only the holder of the
    lease settles a job, so a worker that lost it cannot store a second result."""

    async def submit(self, jobs: Sequence[Job]) -> list[Job]:
        """Adds the jobs, in order; a job whose (tenant, idempotency_key) is already taken is
        not added and the existing job is returned in its place."""
        ...

    async def claim(self, worker: str, *, limit: int, lease_s: float, now: float) -> list[Job]:
        """Up to ``limit`` runnable jobs, lowest priority value first, then oldest ``run_at``:
        queued ones due by ``now``, and running ones whose lease ran out. Each becomes running,
        leased to ``worker`` until now + lease_s, one attempt more. A job past its deadline is
        set expired instead, one whose cancel was asked cancelled; neither is returned."""
        ...

    async def renew(self, job_id: str, worker: str, *, lease_s: float, now: float) -> Job | None:
        """Extends ``worker``'s lease; the job (``is_cancel_requested`` says to stop it), or
        None when the worker holds it no longer."""
        ...

    async def settle(
        self,
        job_id: str,
        worker: str,
        *,
        state: str,
        now: float,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        run_at: float | None = None,
        counts_attempt: bool = True,
    ) -> bool:
        """Ends ``worker``'s run of the job: a final ``state`` with its result or error, or
        "queued" again to run at ``run_at`` (a retry; ``counts_attempt=False`` gives the attempt
        back: the job never ran, e.g. no capacity for it yet). False, changing nothing, when the
        worker does not hold the job's lease."""
        ...

    async def cancel(self, tenant: str, job_id: str, *, now: float) -> Job | None:
        """A queued job is cancelled at once; a running one is marked for its worker to stop
        (then cancelled by it). The job after the change, or None when there is no such job."""
        ...

    async def get(self, tenant: str, job_id: str) -> Job | None: ...

    async def list(
        self,
        tenant: str,
        *,
        state: str | None = None,
        batch_id: str | None = None,
        limit: int = 20,
        after: str | None = None,
    ) -> list[Job]:
        """The tenant's jobs, newest first; ``after``: the last id of the previous page."""
        ...

    async def counts(
        self, tenant: str | None = None, *, batch_id: str | None = None
    ) -> dict[str, int]:
        """How many jobs are in each state (all tenants when None; one batch's)."""
        ...

    async def purge(self, now: float) -> int:
        """Drops the finished jobs whose ``expires_at`` passed; how many."""
        ...


@dataclass
class Storage:
    """The stores one ``storage:`` URL opens; ``close`` releases their connections."""

    url: str
    documents: DocumentStore
    counters: CounterStore
    limits: LimitStore
    cache: CacheStore | None = None  # None until a store for cached answers is opened
    jobs: JobQueue | None = None
    closers: list[Any] = field(default_factory=list)
    # A cheap reachability check (Redis: PING) raising StorageUnavailableError; None for stores
    # in this process (memory, SQLite), which cannot be unreachable.
    ping: Any = None
    # The documents' retention (storage.retained_documents.RetainedDocuments) when TTLs are
    # configured: the sweep asks it for the expired documents.
    retention: Any = None

    async def close(self) -> None:
        for close in self.closers:
            await close()
