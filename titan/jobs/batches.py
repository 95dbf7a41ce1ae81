"""OpenAI's Batch API on the job queue: a JSONL file of requests becomes one job per line.

A batch is a document; its requests are jobs tagged with its id, run by the same workers. A line
that is not a valid request (bad JSON, no custom_id, another endpoint, a body the endpoint would
refuse) becomes an entry of the error file, never a failed batch. When every job is final, one
replica wins the batch (compare-and-set to "finalizing") and writes the output file (answers,
in input order) and the error file; the others see it done.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from titan.context.rag.files import Files, page, scoped_id
from titan.errors import InvalidRequestError, NotFoundError
from titan.jobs.models import MAX_PRIORITY, Owner, check_body, endpoint_of, new_job_id
from titan.storage.base import DocumentStore, Job, JobQueue

BATCHES = "batches"
LINE_ERRORS = "batch_line_errors"
MAX_LINES = 50_000  # OpenAI's limit per batch
BATCH_PRIORITY = MAX_PRIORITY - 2  # below interactive /v1/jobs submissions' default
_WINDOW = re.compile(r"(\d+)(m|h|d)")
_UNITS = {"m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_S = 7 * 86400
# Batches are checked for completion at most this often per replica (a check counts its jobs).
CHECK_INTERVAL_S = 0.5
# A batch "finalizing" this long lost the replica writing its files: another takes over.
STALE_FINALIZING_S = 300.0
ACTIVE = ("validating", "in_progress", "cancelling")

CheckRequest = Callable[[str, Mapping[str, Any], str], None]


def _window_s(window: Any) -> int:
    match = _WINDOW.fullmatch(window) if isinstance(window, str) else None
    seconds = int(match[1]) * _UNITS[match[2]] if match else 0
    if not 0 < seconds <= MAX_WINDOW_S:
        raise InvalidRequestError(
            f"Invalid 'completion_window' {window!r}: give a duration such as '24h' (at most 7d).",
            param="completion_window",
        )
    return seconds


def _version() -> str:
    return uuid.uuid4().hex


class Batches:
    def __init__(
        self,
        documents: DocumentStore,
        files: Files,
        queue: JobQueue,
        check_request: CheckRequest,
        *,
        max_attempts: int,
        result_ttl_s: float,
        now: Callable[[], float] = time.time,
    ):
        self.documents = documents
        self.files = files
        self.queue = queue
        self.check_request = check_request
        self.max_attempts = max_attempts
        self.result_ttl_s = result_ttl_s
        self.now = now
        self._checks: dict[str, asyncio.Task[None]] = {}

    # ---- create ----------------------------------------------------------------------------

    async def create(self, owner: Owner, data: Mapping[str, Any]) -> dict[str, Any]:
        endpoint = endpoint_of(data.get("endpoint"))
        window_s = _window_s(data.get("completion_window", "24h"))
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise InvalidRequestError("'metadata' must be an object.", param="metadata")
        file_id = data.get("input_file_id")
        if not isinstance(file_id, str):
            raise InvalidRequestError("'input_file_id' is required.", param="input_file_id")
        file = await self.files.get(owner.tenant, file_id)
        if file["purpose"] != "batch":
            raise InvalidRequestError(
                f"File '{file_id}' has purpose {file['purpose']!r}: upload batch input with "
                "purpose 'batch'.",
                param="input_file_id",
            )
        now = self.now()
        batch_id = f"batch_{uuid.uuid4().hex}"
        jobs, errors = self._parse(await self.files.content(owner.tenant, file_id), endpoint,
                                   owner, batch_id, now, now + window_s)  # fmt: skip
        batch = {
            "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": file_id, "completion_window": data.get("completion_window", "24h"),
            "status": "in_progress", "output_file_id": None, "error_file_id": None,
            "created_at": int(now), "in_progress_at": int(now), "expires_at": int(now + window_s),
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": len(jobs) + len(errors), "completed": 0,
                               "failed": len(errors)},
            "metadata": metadata,
        }  # fmt: skip
        # Jobs first: a crash in between leaves jobs nobody reads, never a batch without them.
        await self.documents.put(LINE_ERRORS, scoped_id(owner.tenant, batch_id), {"errors": errors})
        await self.queue.submit(jobs)
        await self.documents.put(
            BATCHES, scoped_id(owner.tenant, batch_id),
            {**batch, "tenant": owner.tenant, "num_line_errors": len(errors),
             "_version": _version()},
        )  # fmt: skip
        return await self.get(owner.tenant, batch_id)

    def _parse(
        self, text: str, endpoint: str, owner: Owner, batch_id: str, now: float, deadline: float
    ) -> tuple[list[Job], list[dict[str, Any]]]:
        """One job per valid line; an error entry per invalid one (its line number says which)."""
        jobs: list[Job] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not lines:
            raise InvalidRequestError("The input file holds no requests.", param="input_file_id")
        if len(lines) > MAX_LINES:
            raise InvalidRequestError(
                f"The input file holds {len(lines)} requests; a batch takes at most {MAX_LINES}.",
                param="input_file_id",
            )
        for number, line in lines:
            custom_id = None
            try:
                request = orjson.loads(line)
                if not isinstance(request, dict):
                    raise InvalidRequestError("a line must be a JSON object")
                custom_id = request.get("custom_id")
                if not isinstance(custom_id, str) or not custom_id:
                    raise InvalidRequestError("'custom_id' (a non-empty string) is required")
                if custom_id in seen:
                    raise InvalidRequestError(f"custom_id {custom_id!r} is used twice")
                if request.get("method", "POST") != "POST":
                    raise InvalidRequestError("'method' must be POST")
                if endpoint_of(request.get("url"), "url") != endpoint:
                    raise InvalidRequestError(f"'url' must be the batch's endpoint, {endpoint}")
                body = check_body(request.get("body"))
                self.check_request(endpoint, body, "body")
            except (orjson.JSONDecodeError, InvalidRequestError) as exc:
                message = exc.message if isinstance(exc, InvalidRequestError) else str(exc)
                errors.append({"line": number, "custom_id": custom_id,
                               "message": f"Line {number}: {message}"})  # fmt: skip
                continue
            seen.add(custom_id)
            jobs.append(Job(
                id=new_job_id(), tenant=owner.tenant, priority=MAX_PRIORITY - BATCH_PRIORITY,
                payload={"endpoint": endpoint, "body": body, "key_id": owner.key_id,
                         "custom_id": custom_id, "line": number},
                max_attempts=self.max_attempts, batch_id=batch_id, created_at=now,
                run_at=now, deadline=deadline, result_ttl_s=self.result_ttl_s,
            ))  # fmt: skip
        return jobs, errors

    # ---- read ------------------------------------------------------------------------------

    async def _stored(self, tenant: str, batch_id: str) -> dict[str, Any]:
        stored = await self.documents.get(BATCHES, scoped_id(tenant, batch_id))
        if stored is None:
            raise NotFoundError(f"No such batch: '{batch_id}'.", param="batch_id")
        return stored

    async def get(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """The batch, its counts live; finalized here if its last job just ended."""
        stored = await self._stored(tenant, batch_id)
        if stored["status"] in ACTIVE or self._is_stale(stored):
            stored = await self._refresh(stored)
        return _public(stored)

    async def list(
        self, tenant: str, *, limit: int = 20, after: str | None = None
    ) -> dict[str, Any]:
        batches = [
            _public(stored)
            for _, stored in await self.documents.list(BATCHES)
            if stored.get("tenant") == tenant
        ]
        return page(batches, limit=limit, order="desc", after=after)

    # ---- cancel ----------------------------------------------------------------------------

    async def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """Cancels the requests not yet done; the batch ends "cancelled" with the answers it
        has (running requests stop at their worker)."""
        stored = await self._stored(tenant, batch_id)
        if stored["status"] == "in_progress":
            changed = {**stored, "status": "cancelling", "cancelling_at": int(self.now()),
                       "_version": _version()}  # fmt: skip
            if await self.documents.put_if(BATCHES, scoped_id(tenant, batch_id), changed,
                                           expected=stored["_version"]):  # fmt: skip
                for state in ("queued", "running"):
                    await self._cancel_jobs(tenant, batch_id, state)
        return await self.get(tenant, batch_id)

    async def _cancel_jobs(self, tenant: str, batch_id: str, state: str) -> None:
        after = None
        while jobs := await self.queue.list(tenant, state=state, batch_id=batch_id, limit=500,
                                            after=after):  # fmt: skip
            for job in jobs:
                await self.queue.cancel(tenant, job.id, now=self.now())
            after = jobs[-1].id

    # ---- completion ------------------------------------------------------------------------

    async def job_finished(self, job: Job) -> None:
        """A worker finished one of the batch's jobs: check the batch soon (once per interval
        however many jobs end meanwhile)."""
        if job.batch_id is None or job.batch_id in self._checks:
            return
        self._checks[job.batch_id] = asyncio.create_task(self._check_soon(job.tenant, job.batch_id))

    async def _check_soon(self, tenant: str, batch_id: str) -> None:
        try:
            await asyncio.sleep(CHECK_INTERVAL_S)
        finally:
            self._checks.pop(batch_id, None)
        with contextlib.suppress(NotFoundError):  # deleted meanwhile
            await self.get(tenant, batch_id)

    def _is_stale(self, stored: dict[str, Any]) -> bool:
        finalizing = stored["status"] == "finalizing" and stored["finalizing_at"] is not None
        return finalizing and self.now() - stored["finalizing_at"] > STALE_FINALIZING_S

    async def _refresh(self, stored: dict[str, Any]) -> dict[str, Any]:
        tenant, batch_id = stored["tenant"], stored["id"]
        counts = await self.queue.counts(tenant, batch_id=batch_id)
        # The line errors themselves (maybe megabytes) are read only to write the error file.
        stored["request_counts"] = _request_counts(counts, stored["num_line_errors"])
        if counts.get("queued", 0) or counts.get("running", 0):
            return stored
        finalizing = {**stored, "status": "finalizing", "finalizing_at": int(self.now()),
                      "_version": _version()}  # fmt: skip
        key = scoped_id(tenant, batch_id)
        if not await self.documents.put_if(BATCHES, key, finalizing, expected=stored["_version"]):
            return await self._stored(tenant, batch_id)  # another replica finalizes it
        errors = await self.documents.get(LINE_ERRORS, key) or {}
        done = await self._write_files(finalizing, counts, errors.get("errors", []))
        await self.documents.put(BATCHES, key, done)
        return done

    async def _write_files(
        self, batch: dict[str, Any], counts: dict[str, int], line_errors: list[dict[str, Any]]
    ) -> dict[str, Any]:
        tenant, batch_id = batch["tenant"], batch["id"]
        jobs: list[Job] = []
        after = None
        while chunk := await self.queue.list(tenant, batch_id=batch_id, limit=1000, after=after):
            jobs += chunk
            after = chunk[-1].id
        jobs.sort(key=lambda j: j.payload["line"])
        outputs = [_output_line(job) for job in jobs if job.state == "succeeded"]
        failures = [_error_line(job) for job in jobs if job.state != "succeeded"]
        failures += [_invalid_line(batch_id, entry) for entry in line_errors]
        now = self.now()
        done = {**batch, "request_counts": _request_counts(counts, len(line_errors)),
                "_version": _version()}  # fmt: skip
        for field, lines, suffix in (("output_file_id", outputs, "output"),
                                     ("error_file_id", failures, "errors")):  # fmt: skip
            if lines:
                data = b"\n".join(orjson.dumps(line) for line in lines) + b"\n"
                name = f"{batch_id}_{suffix}.jsonl"
                file = await self.files.create(tenant, name, "batch_output", data,
                                               "application/jsonl")  # fmt: skip
                done[field] = file["id"]
        if batch["cancelling_at"] is not None:
            done.update(status="cancelled", cancelled_at=int(now))
        elif counts.get("expired", 0):
            done.update(status="expired", expired_at=int(now))
        else:
            done.update(status="completed", completed_at=int(now))
        return done


def _request_counts(counts: dict[str, int], num_line_errors: int) -> dict[str, int]:
    total = sum(counts.values()) + num_line_errors
    completed = counts.get("succeeded", 0)
    failed = num_line_errors + sum(counts.get(s, 0) for s in ("failed", "dead_letter", "expired"))
    return {"total": total, "completed": completed, "failed": failed}


def _output_line(job: Job) -> dict[str, Any]:
    return {
        "id": f"batch_req_{job.id}",
        "custom_id": job.payload["custom_id"],
        "response": {"status_code": 200, "request_id": job.id, "body": job.result},
        "error": None,
    }


def _error_line(job: Job) -> dict[str, Any]:
    error = job.error or {"code": job.state, "message": f"The request ended {job.state}."}
    status = error.get("status")
    response = None
    if status is not None:  # the endpoint answered with an error
        body = {"error": {"message": error["message"], "code": error.get("code")}}
        response = {"status_code": status, "request_id": job.id, "body": body}
    return {
        "id": f"batch_req_{job.id}",
        "custom_id": job.payload["custom_id"],
        "response": response,
        "error": {"code": error.get("code") or job.state, "message": error["message"]},
    }


def _invalid_line(batch_id: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"batch_req_{batch_id}_line{entry['line']}",
        "custom_id": entry["custom_id"],
        "response": None,
        "error": {"code": "invalid_request", "message": entry["message"], "line": entry["line"]},
    }


def _public(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k not in ("tenant", "num_line_errors", "_version")}
