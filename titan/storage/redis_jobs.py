"""The job queue in Redis (``JobQueue``), shared by replicas, delivered through Redis Streams
consumer groups.

The path of a job (``P`` = the key prefix):

- ``submit`` stores the job (``P job:ID``, a hash: ``doc``, its JSON, and ``entry``, its stream
  entry while it has one) and puts its id in ``P jobs:schedule:PRIORITY``, a ZSET scored by
  ``run_at``: the jobs not yet handed to the stream (not due, or waiting for a retry).
- ``claim(now)`` moves the due ids (score <= now, oldest first) of each priority into the stream
  ``P jobs:ready:PRIORITY`` and reads it with XREADGROUP in the consumer group ``titan-workers``
  (one consumer per worker), lowest priority value first. Redis hands each entry to one consumer
  only, which is what keeps concurrent claimers from taking a job twice; the entry then stays in
  the group's pending entry list until the job's run is over, when it is XACKed and XDELed.
  Within a priority jobs go in stream order, i.e. the order they were found due (oldest
  ``run_at`` first at each move), not a global sort of every due ``run_at``.
- Leases live on the job (``worker``, ``lease_until``) and in ``P jobs:leases``, a ZSET scored by
  ``lease_until``, compared with the ``now`` callers pass (their clock, not Redis's, nor stream
  idle times). ``claim`` first takes the jobs whose lease ran out, XCLAIMing their pending entry
  to the new worker. A delivered job gets a provisional lease at once, so one whose claimer died
  between XREADGROUP and taking it is found by the same scan.

What a job becomes is decided in Python by ``titan.storage.job_states`` (``taken``, ``settled``,
``cancelled``); the write is a compare-and-set: one Lua script stores the new document only if the
stored one is still the one read, and updates the indexes, the stream and the counters
(``P jobs:counts:...``, a hash of state -> n per scope, so a batch's progress is one HGETALL) in
the same atomic step. A lost race re-reads and decides again. ``P jobs:tenant:T`` (and per batch)
index the jobs for pages, ``P jobs:expiry`` the finished ones for ``purge``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

import titan.storage.redis_jobs_scripts as scripts
from titan.storage.base import Job
from titan.storage.job_states import cancelled, settled, taken
from titan.storage.redis_errors import translates_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis

DEFAULT_PREFIX = "titan:"
GROUP = "titan-workers"
SUBMIT_PAGE = 500  # jobs per submit script: each blocks Redis only briefly
PURGE_PAGE = 500
LIST_PAGE = 200  # ids read per round trip when a state filter skips some

# (the job as stored, its stream entry id or None) -> the job to write, or None: leave it.
Change = Callable[[Job, str | None], Job | None]


def _str(raw: bytes | str | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def _score(x: float | None) -> str:
    return "" if x is None else repr(float(x))  # round-trips exactly


def _doc(job: Job) -> bytes:
    return orjson.dumps(dataclasses.asdict(job))


@translates_errors
class RedisJobQueue:
    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        # register_script does no I/O: it sends EVALSHA, and the script itself on NOSCRIPT.
        self._transition = client.register_script(scripts.TRANSITION)
        self._submit = client.register_script(scripts.SUBMIT)
        self._deliver = client.register_script(scripts.DELIVER)
        self._page = client.register_script(scripts.PAGE)
        self._purge = client.register_script(scripts.PURGE)

    def _job_key(self, job_id: str) -> str:
        return f"{self._prefix}job:{job_id}"

    def _key(self, name: str) -> str:
        return f"{self._prefix}jobs:{name}"

    def _keys(self, job: Job) -> list[str]:
        """The keys a change to ``job`` touches, in the order the scripts expect ('' for a
        batch or idempotency key the job does not have)."""
        tenant, batch, key = job.tenant, job.batch_id, job.idempotency_key
        in_batch = batch is not None
        return [
            self._job_key(job.id),
            self._key(f"schedule:{job.priority}"),
            self._key("leases"),
            self._key("expiry"),
            self._key(f"ready:{job.priority}"),
            self._key("counts:all"),
            self._key(f"counts:tenant:{tenant}"),
            self._key(f"counts:batch:{batch}") if in_batch else "",
            self._key(f"counts:tenant-batch:{tenant}\x1f{batch}") if in_batch else "",
            self._key(f"idem:{tenant}\x1f{key}") if key is not None else "",
            self._key(f"tenant:{tenant}"),
            self._key(f"tenant-batch:{tenant}\x1f{batch}") if in_batch else "",
        ]

    async def _read(self, job_id: str) -> tuple[bytes | None, str | None]:
        raw, entry = await self._client.hmget(self._job_key(job_id), ["doc", "entry"])
        return raw, _str(entry)

    async def _commit(self, expected: bytes, old: Job, new: Job, *, consumer: str = "") -> bool:
        args = [new.id, expected, _doc(new), old.state, new.state, _score(new.run_at),
                _score(new.lease_until), _score(new.expires_at), consumer, GROUP]  # fmt: skip
        return bool(await self._transition(keys=self._keys(new)[:9], args=args))

    async def _update(
        self,
        job_id: str,
        change: Change,
        *,
        consumer: str = "",
        read: tuple[bytes | None, str | None] | None = None,
    ) -> tuple[Job | None, Job | None]:
        """Applies ``change`` by compare-and-set until it holds; (the job as last read, or None
        when there is none; the job written, or None when ``change`` left it)."""
        while True:
            raw, entry = read if read is not None else await self._read(job_id)
            read = None
            if raw is None:
                return None, None
            job = Job(**orjson.loads(raw))
            new = change(job, entry)
            if new is None:
                return job, None
            if await self._commit(raw, job, new, consumer=consumer):
                return job, new

    async def submit(self, jobs: Sequence[Job]) -> list[Job]:
        stored: list[Job] = []
        for start in range(0, len(jobs), SUBMIT_PAGE):
            page = jobs[start : start + SUBMIT_PAGE]
            keys, args = [self._key("priorities")], [self._job_key(""), GROUP]
            for job in page:
                keys += self._keys(job)
                args += [job.id, _doc(job), _score(job.run_at), job.priority,
                         _score(job.created_at)]  # fmt: skip
            reply = await self._submit(keys=keys, args=args)
            stored += [Job(**orjson.loads(r)) if r else job
                       for job, r in zip(page, reply, strict=True)]  # fmt: skip
        return stored

    async def claim(self, worker: str, *, limit: int, lease_s: float, now: float) -> list[Job]:
        claimed: list[Job] = []
        if limit <= 0:
            return claimed

        # Jobs whose worker died first: they were due before anything still in the schedule,
        # and a steady backlog must not starve them.
        def rescue(job: Job, entry: str | None) -> Job | None:
            lapsed = job.state == "running" and (job.lease_until or 0.0) < now
            orphaned = job.state == "queued" and entry is not None  # delivered; its claimer died
            return taken(job, worker, lease_s, now) if lapsed or orphaned else None

        lapsed_ids = await self._client.zrangebyscore(
            self._key("leases"), "-inf", f"({_score(now)}", start=0, num=limit
        )
        for raw_id in lapsed_ids:
            _, new = await self._update(_str(raw_id) or "", rescue, consumer=worker)
            if new is not None and new.state == "running":
                claimed.append(new)

        priorities = await self._client.zrange(self._key("priorities"), 0, -1)
        for priority in (int(p) for p in priorities):
            while len(claimed) < limit:
                keys = [self._key(f"schedule:{priority}"), self._key(f"ready:{priority}"),
                        self._key("leases")]  # fmt: skip
                args = [_score(now), limit - len(claimed), GROUP, worker, self._job_key(""),
                        _score(now + lease_s)]  # fmt: skip
                delivered = await self._deliver(keys=keys, args=args)
                if not delivered:
                    break
                for raw_eid, raw_id, raw in delivered:
                    if raw:  # else a stale entry, acknowledged by the script
                        eid, job_id = _str(raw_eid) or "", _str(raw_id) or ""
                        job = await self._take(eid, job_id, raw, worker, lease_s, now)
                        if job is not None:
                            claimed.append(job)
        return claimed

    async def _take(
        self, eid: str, job_id: str, raw: bytes, worker: str, lease_s: float, now: float
    ) -> Job | None:
        """Takes the job delivered as stream entry ``eid``: running, leased to ``worker``; None
        when it became final instead (expired, cancelled) or changed hands meanwhile."""

        def take(job: Job, entry: str | None) -> Job | None:
            if entry != eid or job.state != "queued":
                return None  # cancelled meanwhile, or taken by the lease scan
            return taken(job, worker, lease_s, now)

        _, new = await self._update(job_id, take, read=(raw, eid))
        return new if new is not None and new.state == "running" else None

    async def renew(self, job_id: str, worker: str, *, lease_s: float, now: float) -> Job | None:
        def renew(job: Job, _: str | None) -> Job | None:
            if job.state != "running" or job.worker != worker:
                return None
            return dataclasses.replace(job, lease_until=now + lease_s)

        return (await self._update(job_id, renew))[1]

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
        def settle(job: Job, _: str | None) -> Job | None:
            if job.state != "running" or job.worker != worker:
                return None
            return settled(job, state, now, result=result, error=error, run_at=run_at,
                           counts_attempt=counts_attempt)  # fmt: skip

        return (await self._update(job_id, settle))[1] is not None

    async def cancel(self, tenant: str, job_id: str, *, now: float) -> Job | None:
        def cancel(job: Job, _: str | None) -> Job | None:
            changed = cancelled(job, now) if job.tenant == tenant else job
            return None if changed is job else changed

        old, new = await self._update(job_id, cancel)
        if old is None or old.tenant != tenant:
            return None
        return new or old

    async def get(self, tenant: str, job_id: str) -> Job | None:
        raw = await self._client.hget(self._job_key(job_id), "doc")
        job = None if raw is None else Job(**orjson.loads(raw))
        return job if job is not None and job.tenant == tenant else None

    async def list(
        self,
        tenant: str,
        *,
        state: str | None = None,
        batch_id: str | None = None,
        limit: int = 20,
        after: str | None = None,
    ) -> list[Job]:
        if batch_id is None:
            index = self._key(f"tenant:{tenant}")
        else:
            index = self._key(f"tenant-batch:{tenant}\x1f{batch_id}")
        page = limit if state is None else max(limit, LIST_PAGE)
        found: list[Job] = []
        while len(found) < limit:
            ids = await self._page(keys=[index], args=[after or "", page])
            if not ids:  # None: ``after`` is not in the index
                break
            async with self._client.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hget(self._job_key(_str(job_id) or ""), "doc")
                docs = await pipe.execute()
            jobs = (Job(**orjson.loads(raw)) for raw in docs if raw is not None)
            found += [job for job in jobs if state is None or job.state == state]
            after = _str(ids[-1])
            if len(ids) < page:
                break
        return found[:limit]

    async def counts(
        self, tenant: str | None = None, *, batch_id: str | None = None
    ) -> dict[str, int]:
        if batch_id is not None:
            name = f"batch:{batch_id}" if tenant is None else f"tenant-batch:{tenant}\x1f{batch_id}"
        else:
            name = "all" if tenant is None else f"tenant:{tenant}"
        raw = await self._client.hgetall(self._key(f"counts:{name}"))
        counts = {_str(state) or "": int(n) for state, n in raw.items()}
        return {state: n for state, n in counts.items() if n > 0}

    async def purge(self, now: float) -> int:
        purged = 0
        while True:
            raw_ids = await self._client.zrangebyscore(
                self._key("expiry"), "-inf", _score(now), start=0, num=PURGE_PAGE
            )
            ids = [_str(i) or "" for i in raw_ids]
            if not ids:
                return purged
            async with self._client.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hget(self._job_key(job_id), "doc")
                docs = await pipe.execute()
            keys: list[str] = []
            args: list[Any] = []
            for job_id, raw in zip(ids, docs, strict=True):
                if raw is None:  # already purged (or never finished here): only the index left
                    await self._client.zrem(self._key("expiry"), job_id)
                    continue
                job = Job(**orjson.loads(raw))
                keys += self._keys(job)
                args += [job_id, raw, job.state]
            if keys:
                purged += await self._purge(keys=keys, args=args)
            if len(ids) < PURGE_PAGE:
                return purged
