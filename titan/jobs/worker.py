"""A worker: claims due jobs from the queue, runs each in its own task, keeps their leases alive,
and settles them — result, retry with backoff, dead letter, or cancelled.

At least once: a job is settled only after its work finished, and a worker that dies keeps no
job (its leases run out and another worker claims them). Exactly one stored result: only the
lease holder settles. Cancelling cancels the job's task, which cancels the request inside the
pipeline and so the engine's or the upstream's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from titan.errors import OverloadedError, QuotaExceededError, RateLimitError, TitanError
from titan.storage.base import Job, JobQueue
from titan.storage.outage_log import OutageLog

logger = logging.getLogger(__name__)

Execute = Callable[[Job], Awaitable[dict[str, Any]]]
# HTTP statuses worth another attempt: timeouts, conflicts, rate limits, server-side failures.
RETRYABLE_STATUSES = frozenset((408, 409, 425, 429, 500, 502, 503, 504))
# Leases are renewed this often at most: a cancel asked on another replica arrives this fast.
MAX_RENEW_INTERVAL_S = 1.0
# While the queue's store fails, claims back off from poll_s, doubling, up to this.
MAX_OUTAGE_BACKOFF_S = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 1.0
    max_s: float = 60.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Exponential backoff with ±50% jitter, so retries of a burst spread out."""
        return min(self.max_s, self.base_s * 2 ** (attempt - 1)) * rng.uniform(0.5, 1.5)


def is_capacity_refusal(exc: BaseException) -> bool:
    """Refused for want of capacity now (a rate limit, an overloaded queue): the job did not
    run, so it waits and tries again without spending an attempt. A spent budget is not that."""
    return isinstance(exc, RateLimitError | OverloadedError) and not isinstance(
        exc, QuotaExceededError
    )


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, QuotaExceededError):  # waiting does not refill a budget
        return False
    if isinstance(exc, TitanError):
        return exc.status_code in RETRYABLE_STATUSES or exc.status_code >= 500
    return True  # an unexpected failure: maybe transient, and attempts are bounded


def job_error_of(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, TitanError):
        return {"code": exc.code or exc.error_type, "message": exc.message,
                "status": exc.status_code}  # fmt: skip
    return {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"[:500],
            "status": 500}  # fmt: skip


@dataclass
class _Run:
    job: Job
    task: asyncio.Task[None] | None = None
    stop_reason: str | None = None  # "cancelled", "stopping" or "lost" once told to stop
    done: asyncio.Event = field(default_factory=asyncio.Event)


class JobWorker:
    def __init__(
        self,
        queue: JobQueue,
        execute: Execute,
        *,
        name: str,
        concurrency: int,
        lease_s: float,
        poll_s: float,
        retry: RetryPolicy = RetryPolicy(),
        may_start: Callable[[], bool] = lambda: True,
        on_finished: Callable[[Job], Awaitable[None]] | None = None,
        now: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ):
        self.queue = queue
        self.execute = execute
        self.name = name
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.retry = retry
        self.may_start = may_start  # False: leave capacity to interactive traffic for now
        self.on_finished = on_finished  # told of each job that reached a final state here
        self.now = now
        self.rng = rng or random.Random()
        self.runs: dict[str, _Run] = {}
        self.num_settled = 0
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._is_stopping = False
        extra = {"worker": name}
        self._claims = OutageLog(f"worker {name}: claiming jobs", logger, extra)
        self._renewals = OutageLog(f"worker {name}: renewing leases", logger, extra)
        self._settlements = OutageLog(f"worker {name}: storing job outcomes", logger, extra)

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._claim_loop(), name=f"{self.name}-claim"),
            asyncio.create_task(self._lease_loop(), name=f"{self.name}-lease"),
        ]

    def wake(self) -> None:
        """New jobs may be due (one was submitted here): look now rather than at the next poll."""
        self._wake.set()

    def cancel_local(self, job_id: str) -> bool:
        """Stops the job at once if it runs here (its settlement says cancelled)."""
        return self._stop_run(job_id, "cancelled")

    async def stop(self) -> None:
        """Stops claiming; running jobs are cancelled and put back in the queue for another
        worker (a graceful hand-off rather than a lease left to run out)."""
        self._is_stopping = True
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        for job_id in list(self.runs):
            self._stop_run(job_id, "stopping")
        await asyncio.gather(*(r.done.wait() for r in list(self.runs.values())))

    # ---- loops -------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while not self._is_stopping:
            self._wake.clear()
            free = self.concurrency - len(self.runs)
            claimed: list[Job] = []
            if free > 0 and self.may_start():
                try:
                    claimed = await self.queue.claim(
                        self.name, limit=free, lease_s=self.lease_s, now=self.now()
                    )
                except Exception as exc:  # the store is down: keep trying, slowly
                    self._claims.failed(exc)
                else:
                    self._claims.succeeded()
                for job in claimed:
                    self._launch(job)
            if claimed and len(claimed) == free:
                continue  # maybe more are due: claim again once a slot frees
            with contextlib.suppress(TimeoutError):  # the poll: jobs may have come due
                await asyncio.wait_for(
                    self._wake.wait(), self._claims.backoff_s(self.poll_s, MAX_OUTAGE_BACKOFF_S)
                )

    async def _lease_loop(self) -> None:
        interval = min(self.lease_s / 3, MAX_RENEW_INTERVAL_S)
        while True:
            await asyncio.sleep(interval)
            for job_id, run in list(self.runs.items()):
                if run.stop_reason is not None:
                    continue
                try:
                    held = await self.queue.renew(
                        job_id, self.name, lease_s=self.lease_s, now=self.now()
                    )
                except Exception as exc:  # keep the job: the lease outlives a short outage
                    self._renewals.failed(exc)
                    break  # the others would fail alike: try them all again next round
                self._renewals.succeeded()
                if held is None:  # another worker has it now: our result would not count
                    self._stop_run(job_id, "lost")
                elif held.is_cancel_requested:
                    self._stop_run(job_id, "cancelled")

    # ---- one job -----------------------------------------------------------------------------

    def _launch(self, job: Job) -> None:
        run = _Run(job)
        self.runs[job.id] = run
        run.task = asyncio.create_task(self._run(run), name=f"job-{job.id}")

    def _stop_run(self, job_id: str, reason: str) -> bool:
        run = self.runs.get(job_id)
        if run is None or run.task is None or run.stop_reason is not None:
            return False
        run.stop_reason = reason
        run.task.cancel()
        return True

    async def _run(self, run: _Run) -> None:
        job = run.job
        try:
            try:
                result = await self.execute(job)
            except asyncio.CancelledError:
                await self._after_cancel(run)
            except Exception as exc:
                await self._after_failure(job, exc)
            else:
                await self._settle(job, "succeeded", result=result)
        except Exception as exc:  # settling failed: the lease runs out and the job runs again
            self._settlements.failed(exc)
        finally:
            self.runs.pop(job.id, None)
            run.done.set()
            self._wake.set()

    async def _after_cancel(self, run: _Run) -> None:
        if run.stop_reason == "cancelled":
            error = {"code": "cancelled", "message": "Cancelled while running."}
            await self._settle(run.job, "cancelled", error=error)
        elif run.stop_reason == "stopping":  # back in line at once, for another worker
            await asyncio.shield(self._settle(run.job, "queued", error=run.job.error))
        # "lost": another worker holds the job; nothing of ours may be stored.

    async def _after_failure(self, job: Job, exc: Exception) -> None:
        error = job_error_of(exc)
        if is_capacity_refusal(exc):
            wait_s = max(getattr(exc, "retry_after", None) or 0.0, self.retry.base_s)
            run_at = self.now() + wait_s * self.rng.uniform(1.0, 1.5)
            await self._settle(job, "queued", error=error, run_at=run_at, counts_attempt=False)
        elif not is_retryable(exc):
            await self._settle(job, "failed", error=error)
        elif job.attempts >= job.max_attempts:
            await self._settle(job, "dead_letter", error=error)
        else:
            run_at = self.now() + self.retry.delay_s(job.attempts, self.rng)
            await self._settle(job, "queued", error=error, run_at=run_at)

    async def _settle(self, job: Job, state: str, **outcome: Any) -> None:
        settled = await self.queue.settle(job.id, self.name, state=state, now=self.now(),
                                          **outcome)  # fmt: skip
        self._settlements.succeeded()
        if settled:
            self.num_settled += 1
        if settled and state != "queued" and self.on_finished is not None:
            await self.on_finished(job)
