"""Async jobs over the pipeline: ``/v1/jobs`` submissions land in the storage's durable queue,
and workers (in ``titan serve``, or ``titan worker`` processes) run them through the same
pipeline as interactive requests — the submitter's key, limits, cache and routing — at the
batch priority class, routed to batch deployments where there are any."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from titan.config.jobs import JobsConfig
from titan.context.rag.files import Files
from titan.errors import InvalidRequestError, NotFoundError, ServiceUnavailableError
from titan.jobs.batches import Batches
from titan.jobs.models import ENDPOINTS, Owner, job_from_request, public_job
from titan.jobs.worker import JobWorker, RetryPolicy
from titan.observability.metrics import TitanMetrics
from titan.protocol import ChatCompletionRequest, ClientRequest, CompletionRequest, answer_bytes
from titan.protocol.common import list_object, validated
from titan.service.admission import Admission
from titan.service.authentication import Authenticator
from titan.service.requests import RequestFlow
from titan.storage.base import JOB_STATES, Job, JobQueue, Storage
from titan.storage.outage_log import OutageLog

logger = logging.getLogger(__name__)

PURGE_INTERVAL_S = 60.0
GAUGE_INTERVAL_S = 5.0
MAX_PAGE = 1000
# Pipeline endpoints and the request model each validates with.
_PARSERS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}


def worker_name() -> str:
    """Unique per process and start: a restarted worker never mistakes old leases for its own."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class JobsService:
    """The pipeline's one jobs service: it owns the in-process worker."""

    def __init__(
        self,
        config: JobsConfig,
        storage: Storage,
        auth: Authenticator,
        flow: RequestFlow,
        admission: Admission,
        metrics: TitanMetrics,
    ):
        self.config = config
        self.storage = storage
        self.auth = auth
        self.flow = flow
        self.admission = admission
        self.metrics = metrics
        self.worker: JobWorker | None = None
        self._purging: asyncio.Task[None] | None = None
        self._batches: Batches | None = None

    @property
    def queue(self) -> JobQueue:
        if self.storage.jobs is None:
            raise ServiceUnavailableError("Titan is still starting; retry shortly.")
        return self.storage.jobs

    @property
    def batches(self) -> Batches:
        """The Batch API over the same queue (finalized by whichever worker ends a batch)."""
        if self._batches is None:
            documents = self.storage.documents
            self._batches = Batches(
                documents, Files(documents, time.time), self.queue, self.check_request,
                max_attempts=self.config.max_attempts, result_ttl_s=self.config.result_ttl_s,
            )  # fmt: skip
        return self._batches

    async def owner(self, api_key: str | None) -> Owner:
        tenant, key_id = await self.auth.identify(api_key)
        return Owner(tenant, key_id)

    # ---- the API ---------------------------------------------------------------------------

    async def submit(self, data: Mapping[str, Any], api_key: str | None) -> tuple[dict, bool]:
        """(the job, whether it is new): an idempotency key already used returns its job."""
        queue = self.queue
        job = job_from_request(
            data, await self.owner(api_key), max_attempts=self.config.max_attempts,
            result_ttl_s=self.config.result_ttl_s,
        )  # fmt: skip
        self.check_request(job.payload["endpoint"], job.payload["body"])
        (stored,) = await queue.submit([job])
        if self.worker is not None:
            self.worker.wake()
        return public_job(stored), stored.id == job.id

    def check_request(self, endpoint: str, body: Mapping[str, Any], param: str = "body") -> None:
        """Refuses now (400) a body the endpoint would refuse when the job runs."""
        validated(_PARSERS[ENDPOINTS[endpoint]], body, (param,))

    async def get(self, job_id: str, api_key: str | None) -> dict[str, Any]:
        queue = self.queue
        job = await queue.get((await self.owner(api_key)).tenant, job_id)
        if job is None:
            raise NotFoundError(f"No such job: '{job_id}'.", param="job_id")
        return public_job(job)

    async def list(
        self,
        api_key: str | None,
        *,
        status: str | None = None,
        batch_id: str | None = None,
        limit: int = 20,
        after: str | None = None,
    ) -> dict[str, Any]:
        if status is not None and status not in JOB_STATES:
            raise InvalidRequestError(
                f"Invalid 'status' {status!r}: use one of {', '.join(JOB_STATES)}.", param="status"
            )
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRequestError(f"'limit' must be between 1 and {MAX_PAGE}.", param="limit")
        tenant = (await self.owner(api_key)).tenant
        jobs = await self.queue.list(tenant, state=status, batch_id=batch_id, limit=limit + 1,
                                     after=after)  # fmt: skip
        data = [public_job(job) for job in jobs[:limit]]
        return list_object(data, has_more=len(jobs) > limit)

    async def cancel(self, job_id: str, api_key: str | None) -> dict[str, Any]:
        """A queued job is cancelled at once; a running one stops at once on this replica, or
        at its worker's next lease renewal (within a second) elsewhere."""
        tenant = (await self.owner(api_key)).tenant
        job = await self.queue.cancel(tenant, job_id, now=time.time())
        if job is None:
            raise NotFoundError(f"No such job: '{job_id}'.", param="job_id")
        if job.is_cancel_requested and self.worker is not None:
            self.worker.cancel_local(job_id)
        return public_job(job)

    # ---- running them ----------------------------------------------------------------------

    async def execute(self, job: Job) -> dict[str, Any]:
        """One attempt at the job: its request through the pipeline, as its key, at the batch
        priority class. Raises the pipeline's errors (the worker decides on retries)."""
        payload = job.payload
        endpoint = ENDPOINTS[payload["endpoint"]]
        body = dict(payload["body"])
        request = ClientRequest(
            endpoint=endpoint,  # type: ignore[arg-type]
            parsed=_PARSERS[endpoint].model_validate(body),
            body=body,
            request_id=f"{job.id}-{job.attempts}",
            headers={"x-titan-priority": "batch"},
            key_id=payload.get("key_id"),
        )
        routed = await self.flow.complete(request)
        return orjson.loads(answer_bytes(routed.value))  # type: ignore[no-any-return]

    def start_worker(self, *, concurrency: int | None = None) -> JobWorker:
        config = self.config
        self.worker = JobWorker(
            self.queue, self.execute, name=worker_name(),
            concurrency=concurrency or config.workers, lease_s=config.lease_s,
            poll_s=config.poll_s, retry=RetryPolicy(config.backoff_base_s, config.backoff_max_s),
            may_start=self._may_start, on_finished=self._finished,
        )  # fmt: skip
        self.worker.start()
        self.start_upkeep()
        return self.worker

    def start_upkeep(self) -> None:
        """Purging expired jobs and the jobs-by-state gauge, in every process with a queue: a
        gateway without an in-process worker still exports the queue depth autoscalers read."""
        if self._purging is None:
            self._purging = asyncio.create_task(self._purge_loop())

    async def stop(self) -> None:
        if self._purging is not None:
            self._purging.cancel()
            await asyncio.gather(self._purging, return_exceptions=True)
        if self.worker is not None:
            await self.worker.stop()

    def _may_start(self) -> bool:
        """Jobs wait while interactive or normal requests queue for a model."""
        if not self.config.yield_to_interactive:
            return True
        return not any(q.num_waiting_before("batch") for q in self.admission.queues.values())

    async def _finished(self, job: Job) -> None:
        if job.batch_id is not None:
            await self.batches.job_finished(job)

    async def _purge_loop(self) -> None:
        """Drops expired jobs now and then, and keeps the jobs-by-state gauge current."""
        next_purge = 0.0
        upkeep = OutageLog("job queue upkeep", logger)
        while True:
            try:
                if time.monotonic() >= next_purge:
                    await self.queue.purge(time.time())
                    next_purge = time.monotonic() + PURGE_INTERVAL_S
                counts = await self.queue.counts()
                for state in JOB_STATES:
                    self.metrics.jobs.labels(state).set(counts.get(state, 0))
            except Exception as exc:  # storage down: once per outage, then back off
                upkeep.failed(exc)
            else:
                upkeep.succeeded()
            await asyncio.sleep(upkeep.backoff_s(GAUGE_INTERVAL_S, max_s=60.0))
