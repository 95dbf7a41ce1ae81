"""The job queue in SQLite (WAL): one row per job, claims and settlements in ``BEGIN IMMEDIATE``
transactions, so several processes on one file (``titan serve`` and ``titan jobs``) never claim a
job twice. Also the queue of ``memory://`` storage, on an in-memory database: one engine to test.

Each row keeps the whole job as JSON (``doc``) and copies of the fields that queries filter and
order on, indexed; every write rewrites both.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from titan.storage.base import Job
from titan.storage.job_states import cancelled, settled, taken
from titan.storage.sqlite import SqliteDatabase, write_transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL,
    run_at REAL NOT NULL,
    lease_until REAL,
    batch_id TEXT,
    idempotency_key TEXT,
    created_at REAL NOT NULL,
    expires_at REAL,
    doc TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (state, priority, run_at);
CREATE INDEX IF NOT EXISTS jobs_leases ON jobs (state, lease_until);
CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs (tenant, created_at, id);
CREATE INDEX IF NOT EXISTS jobs_batch ON jobs (batch_id, state) WHERE batch_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
"""
_COLUMNS = "id, tenant, state, priority, run_at, lease_until, batch_id, idempotency_key, " \
    "created_at, expires_at, doc"  # fmt: skip


def _row(job: Job) -> tuple[Any, ...]:
    return (
        job.id, job.tenant, job.state, job.priority, job.run_at, job.lease_until, job.batch_id,
        job.idempotency_key, job.created_at, job.expires_at,
        orjson.dumps(dataclasses.asdict(job)).decode(),
    )  # fmt: skip


def _job(doc: str) -> Job:
    return Job(**orjson.loads(doc))


def _write(connection: sqlite3.Connection, job: Job) -> None:
    connection.execute(f"INSERT OR REPLACE INTO jobs ({_COLUMNS}) VALUES ({', '.join('?' * 11)})",
                       _row(job))  # fmt: skip


def _matching(**columns: str | None) -> tuple[list[str], list[Any]]:
    """WHERE conditions (and their arguments) for the columns given a value; "1" for none."""
    given = {name: value for name, value in columns.items() if value is not None}
    return ["1", *(f"{name} = ?" for name in given)], list(given.values())


def _read(connection: sqlite3.Connection, job_id: str) -> Job | None:
    row = connection.execute("SELECT doc FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return None if row is None else _job(row[0])


class SqliteJobQueue:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    @classmethod
    async def open(cls, db: SqliteDatabase) -> SqliteJobQueue:
        await db.run(lambda connection: connection.executescript(SCHEMA))
        return cls(db)

    async def _transaction(self, work: Any) -> Any:
        def run(connection: sqlite3.Connection) -> Any:
            # Committed, or rolled back and raised (a refused COMMIT too): a job the caller is
            # told was stored is stored; one that could not be is an error (503), never a 202.
            with write_transaction(connection):
                return work(connection)

        return await self._db.run(run)

    async def submit(self, jobs: Sequence[Job]) -> list[Job]:
        def submit(connection: sqlite3.Connection) -> list[Job]:
            stored = []
            for job in jobs:
                if job.idempotency_key is not None:
                    row = connection.execute(
                        "SELECT doc FROM jobs WHERE tenant = ? AND idempotency_key = ?",
                        (job.tenant, job.idempotency_key),
                    ).fetchone()
                    if row is not None:
                        stored.append(_job(row[0]))
                        continue
                _write(connection, job)
                stored.append(job)
            return stored

        return await self._transaction(submit)  # type: ignore[no-any-return]

    async def claim(self, worker: str, *, limit: int, lease_s: float, now: float) -> list[Job]:
        def claim(connection: sqlite3.Connection) -> list[Job]:
            claimed: list[Job] = []
            while len(claimed) < limit:
                need = limit - len(claimed)
                rows = connection.execute(
                    "SELECT doc FROM jobs WHERE state = 'queued' AND run_at <= ? "
                    "ORDER BY priority, run_at LIMIT ?",
                    (now, need),
                ).fetchall()
                if len(rows) < need:  # then jobs whose worker died (their lease ran out)
                    rows += connection.execute(
                        "SELECT doc FROM jobs WHERE state = 'running' AND lease_until < ? LIMIT ?",
                        (now, need - len(rows)),
                    ).fetchall()
                if not rows:
                    break
                for (doc,) in rows:
                    job = _job(doc)
                    claimed_job = taken(job, worker, lease_s, now)
                    _write(connection, claimed_job)
                    if claimed_job.state == "running":
                        claimed.append(claimed_job)
            return claimed

        return await self._transaction(claim)  # type: ignore[no-any-return]

    async def renew(self, job_id: str, worker: str, *, lease_s: float, now: float) -> Job | None:
        def renew(connection: sqlite3.Connection) -> Job | None:
            job = _read(connection, job_id)
            if job is None or job.state != "running" or job.worker != worker:
                return None
            job.lease_until = now + lease_s
            _write(connection, job)
            return job

        return await self._transaction(renew)  # type: ignore[no-any-return]

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
        def settle(connection: sqlite3.Connection) -> bool:
            job = _read(connection, job_id)
            if job is None or job.state != "running" or job.worker != worker:
                return False
            _write(connection, settled(job, state, now, result=result, error=error,
                                       run_at=run_at, counts_attempt=counts_attempt))  # fmt: skip
            return True

        return await self._transaction(settle)  # type: ignore[no-any-return]

    async def cancel(self, tenant: str, job_id: str, *, now: float) -> Job | None:
        def cancel(connection: sqlite3.Connection) -> Job | None:
            job = _read(connection, job_id)
            if job is None or job.tenant != tenant:
                return None
            changed = cancelled(job, now)
            if changed is not job:
                _write(connection, changed)
            return changed

        return await self._transaction(cancel)  # type: ignore[no-any-return]

    async def get(self, tenant: str, job_id: str) -> Job | None:
        job = await self._db.run(lambda connection: _read(connection, job_id))
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
        def list_(connection: sqlite3.Connection) -> list[Job]:
            where, args = _matching(tenant=tenant, state=state, batch_id=batch_id)
            if after is not None:
                cursor = connection.execute(
                    "SELECT created_at, id FROM jobs WHERE id = ? AND tenant = ?", (after, tenant)
                ).fetchone()
                if cursor is None:
                    return []
                where.append("(created_at, id) < (?, ?)")
                args += list(cursor)
            rows = connection.execute(
                f"SELECT doc FROM jobs WHERE {' AND '.join(where)} "
                "ORDER BY created_at DESC, id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
            return [_job(doc) for (doc,) in rows]

        return await self._db.run(list_)  # type: ignore[no-any-return]

    async def counts(
        self, tenant: str | None = None, *, batch_id: str | None = None
    ) -> dict[str, int]:
        def counts(connection: sqlite3.Connection) -> dict[str, int]:
            where, args = _matching(tenant=tenant, batch_id=batch_id)
            rows = connection.execute(
                f"SELECT state, COUNT(*) FROM jobs WHERE {' AND '.join(where)} GROUP BY state",
                args,
            ).fetchall()
            return {state: count for state, count in rows}

        return await self._db.run(counts)  # type: ignore[no-any-return]

    async def purge(self, now: float) -> int:
        def purge(connection: sqlite3.Connection) -> int:
            return connection.execute(
                "DELETE FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
            ).rowcount

        return await self._transaction(purge)  # type: ignore[no-any-return]
