"""Jobs sealed at rest: a ``JobQueue`` wrapper that seals each job's ``payload`` (the request,
batch lines included) and ``result`` (the answer).

The queue never looks inside either (its rules read the other fields: state, leases, priority,
times), so sealing them changes nothing it decides. Each is bound to the job's id and field,
so a payload copied to another job fails to open. Jobs stored in clear read as they are.
``error`` stays in clear: its messages are Titan's own, and the dashboard counts its codes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from titan.storage.base import Job, JobQueue
from titan.storage.sealed import Keyring, SealedDocuments

NAMESPACE = "jobs"


class SealedJobs:
    def __init__(self, inner: JobQueue, keyring: Keyring):
        self.inner = inner
        # The document sealing, reused for the two JSON fields (it keeps no store of its own).
        self._sealing = SealedDocuments(None, keyring)  # type: ignore[arg-type]

    def _seal_field(self, job_id: str, name: str, value: dict[str, Any] | None) -> Any:
        if value is None:
            return None
        return self._sealing.seal(NAMESPACE, f"{job_id}/{name}", value)

    def _open_field(self, job_id: str, name: str, value: dict[str, Any] | None) -> Any:
        if value is None:
            return None
        return self._sealing.open(NAMESPACE, f"{job_id}/{name}", value)

    def _seal(self, job: Job) -> Job:
        return dataclasses.replace(
            job,
            payload=self._seal_field(job.id, "payload", job.payload),
            result=self._seal_field(job.id, "result", job.result),
        )

    def _open(self, job: Job | None) -> Job | None:
        if job is None:
            return None
        job.payload = self._open_field(job.id, "payload", job.payload)
        job.result = self._open_field(job.id, "result", job.result)
        return job

    def _open_all(self, jobs: Sequence[Job]) -> list[Job]:
        return [self._open(job) for job in jobs]  # type: ignore[misc]

    async def submit(self, jobs: Sequence[Job]) -> list[Job]:
        return self._open_all(await self.inner.submit([self._seal(job) for job in jobs]))

    async def claim(self, worker: str, *, limit: int, lease_s: float, now: float) -> list[Job]:
        jobs = await self.inner.claim(worker, limit=limit, lease_s=lease_s, now=now)
        return self._open_all(jobs)

    async def renew(self, job_id: str, worker: str, *, lease_s: float, now: float) -> Job | None:
        return self._open(await self.inner.renew(job_id, worker, lease_s=lease_s, now=now))

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
        return await self.inner.settle(
            job_id, worker, state=state, now=now,
            result=self._seal_field(job_id, "result", result), error=error, run_at=run_at,
            counts_attempt=counts_attempt,
        )  # fmt: skip

    async def cancel(self, tenant: str, job_id: str, *, now: float) -> Job | None:
        return self._open(await self.inner.cancel(tenant, job_id, now=now))

    async def get(self, tenant: str, job_id: str) -> Job | None:
        return self._open(await self.inner.get(tenant, job_id))

    async def list(
        self,
        tenant: str,
        *,
        state: str | None = None,
        batch_id: str | None = None,
        limit: int = 20,
        after: str | None = None,
    ) -> list[Job]:
        jobs = await self.inner.list(
            tenant, state=state, batch_id=batch_id, limit=limit, after=after
        )
        return self._open_all(jobs)

    async def counts(
        self, tenant: str | None = None, *, batch_id: str | None = None
    ) -> dict[str, int]:
        return await self.inner.counts(tenant, batch_id=batch_id)

    async def purge(self, now: float) -> int:
        return await self.inner.purge(now)
