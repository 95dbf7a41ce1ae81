"""Async jobs and batches: how workers run them."""

from __future__ import annotations

from pydantic import Field

from titan.config.settings import Settings


class JobsConfig(Settings):
    """``workers``: jobs one process runs at once (``titan serve`` runs them in-process; set 0
    there when ``titan worker`` processes serve the queue). A claimed job is leased for
    ``lease_s`` and the lease renewed while it runs: a worker that dies loses its jobs to
    another within that time. Retryable failures (429, 5xx, timeouts, overload) are retried
    after ``backoff_base_s`` × 2^(attempt − 1), ±50% jitter, at most ``backoff_max_s``; after
    ``max_attempts`` the job is dead-lettered."""

    workers: int = Field(16, ge=0)
    lease_s: float = Field(30.0, gt=0)
    max_attempts: int = Field(3, ge=1)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    result_ttl_s: float = Field(7 * 86400.0, gt=0)  # finished jobs are kept this long
    poll_s: float = Field(0.5, gt=0)  # how often an idle worker looks for due jobs
    # Start no job while interactive or normal requests wait for a model: jobs use the capacity
    # they leave free.
    yield_to_interactive: bool = True
