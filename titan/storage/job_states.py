"""How a job changes state: the rules every job queue applies (inside its own transaction)."""

from __future__ import annotations

import dataclasses
from typing import Any

from titan.storage.base import FINAL_JOB_STATES, Job


def taken(job: Job, worker: str, lease_s: float, now: float) -> Job:
    """A due job claimed by ``worker`` (running), or what it became instead (final)."""
    if job.is_cancel_requested:
        return settled(job, "cancelled", now, error=job_error("cancelled", "Cancelled."))
    if job.deadline is not None and now >= job.deadline:
        message = "The job's deadline passed before it could run."
        return settled(job, "expired", now, error=job_error("expired", message))
    if job.attempts >= job.max_attempts:  # its workers died on every attempt
        message = f"Every attempt ({job.attempts}) ended without a result (its worker stopped)."
        lost = job.error or job_error("worker_lost", message)
        return settled(job, "dead_letter", now, error=lost)
    return dataclasses.replace(
        job,
        state="running",
        worker=worker,
        lease_until=now + lease_s,
        attempts=job.attempts + 1,
        started_at=job.started_at or now,
    )


def settled(
    job: Job,
    state: str,
    now: float,
    *,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    run_at: float | None = None,
    counts_attempt: bool = True,
) -> Job:
    """The job run to ``state``: final (kept ``result_ttl_s`` more), or "queued" again at
    ``run_at`` (a retry; the error is kept for the record; ``counts_attempt=False``: the attempt
    is given back)."""
    if state == "queued":
        attempts = job.attempts if counts_attempt else max(0, job.attempts - 1)
        return dataclasses.replace(job, state="queued", worker=None, lease_until=None,
                                   run_at=run_at if run_at is not None else now,
                                   error=error, attempts=attempts)  # fmt: skip
    if state not in FINAL_JOB_STATES:
        raise ValueError(f"cannot settle a job as {state!r}")
    expires_at = None if job.result_ttl_s is None else now + job.result_ttl_s
    return dataclasses.replace(
        job, state=state, worker=None, lease_until=None, finished_at=now, result=result,
        error=error, expires_at=expires_at,
    )  # fmt: skip


def cancelled(job: Job, now: float) -> Job:
    """The job after a cancel: queued → cancelled; running → marked for its worker; a final
    job unchanged (the same object)."""
    if job.state == "queued":
        return settled(job, "cancelled", now, error=job_error("cancelled", "Cancelled."))
    if job.state == "running" and not job.is_cancel_requested:
        return dataclasses.replace(job, is_cancel_requested=True)
    return job


def job_error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}
