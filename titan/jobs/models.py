"""What a job is on the wire: the submission ``/v1/jobs`` accepts and the object it answers.

The queue orders jobs by a number, lowest first; clients give a priority 0–9, highest first (or
"low", "normal", "high"), so the queue stores 9 − priority. A deadline is a Unix time, or a
number of seconds from now when below 10^9 (no deadline is due in 2001).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from titan.errors import InvalidRequestError
from titan.storage.base import Job

# The OpenAI paths a job may run, and the pipeline endpoint each one is.
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
PRIORITY_NAMES = {"low": 2, "normal": 5, "high": 8}
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5
RELATIVE_DEADLINE_BELOW = 1e9
MAX_IDEMPOTENCY_KEY_CHARS = 256


def new_job_id() -> str:
    return f"job_{uuid.uuid4().hex}"


def endpoint_of(url: Any, param: str = "endpoint") -> str:
    """The pipeline endpoint for an OpenAI path ("/v1/chat/completions" or without "/v1")."""
    path = url if isinstance(url, str) else ""
    path = path if path.startswith("/v1/") else f"/v1{path}" if path.startswith("/") else path
    if path not in ENDPOINTS:
        raise InvalidRequestError(
            f"Invalid '{param}' {url!r}: jobs run {', '.join(ENDPOINTS)}.", param=param
        )
    return path


def check_body(body: Any, param: str = "body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequestError(f"'{param}' must be a JSON object: the request to run.",
                                  param=param)  # fmt: skip
    if body.get("stream"):
        raise InvalidRequestError(
            f"'{param}.stream' must be false: a job's answer is stored whole, not streamed.",
            param=f"{param}.stream",
        )
    return body


def queue_priority(asked: Any) -> int:
    """The queue's order value (lower first) for a client's priority (higher first)."""
    if asked is None:
        return MAX_PRIORITY - DEFAULT_PRIORITY
    if isinstance(asked, str) and asked in PRIORITY_NAMES:
        return MAX_PRIORITY - PRIORITY_NAMES[asked]
    if isinstance(asked, int) and not isinstance(asked, bool) and 0 <= asked <= MAX_PRIORITY:
        return MAX_PRIORITY - asked
    raise InvalidRequestError(
        f"Invalid 'priority' {asked!r}: give an integer from 0 to {MAX_PRIORITY} (higher runs "
        f"first) or one of {', '.join(PRIORITY_NAMES)}.",
        param="priority",
    )


def deadline_of(asked: Any, now: float) -> float | None:
    if asked is None:
        return None
    if isinstance(asked, str):
        try:
            return datetime.fromisoformat(asked.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    elif isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
        return now + asked if asked < RELATIVE_DEADLINE_BELOW else float(asked)
    raise InvalidRequestError(
        f"Invalid 'deadline' {asked!r}: give a Unix time, an ISO 8601 time, or seconds from now.",
        param="deadline",
    )


def idempotency_key_of(asked: Any) -> str | None:
    if asked is None:
        return None
    if not isinstance(asked, str) or not 0 < len(asked) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidRequestError(
            f"'idempotency_key' must be a string of 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters.",
            param="idempotency_key",
        )
    return asked


@dataclass(frozen=True)
class Owner:
    """Who submits: the tenant the job belongs to and the key it runs as."""

    tenant: str
    key_id: str | None


def job_from_request(
    data: Mapping[str, Any],
    owner: Owner,
    *,
    max_attempts: int,
    result_ttl_s: float,
    now: float | None = None,
) -> Job:
    """A job for ``POST /v1/jobs``'s body, or InvalidRequestError saying what is wrong."""
    unknown = set(data) - {"endpoint", "body", "priority", "idempotency_key", "deadline",
                           "metadata"}  # fmt: skip
    if unknown:
        raise InvalidRequestError(
            f"Unknown field(s) {', '.join(sorted(unknown))}: a job takes endpoint, body, "
            "priority, idempotency_key, deadline and metadata.",
            param=sorted(unknown)[0],
        )
    now = time.time() if now is None else now
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidRequestError("'metadata' must be an object.", param="metadata")
    payload = {
        "endpoint": endpoint_of(data.get("endpoint", "/v1/chat/completions")),
        "body": check_body(data.get("body")),
        "key_id": owner.key_id,
        "metadata": metadata,
    }
    return Job(
        id=new_job_id(),
        tenant=owner.tenant,
        payload=payload,
        priority=queue_priority(data.get("priority")),
        max_attempts=max_attempts,
        idempotency_key=idempotency_key_of(data.get("idempotency_key")),
        created_at=now,
        run_at=now,
        deadline=deadline_of(data.get("deadline"), now),
        result_ttl_s=result_ttl_s,
    )


def _seconds(value: float | None) -> int | None:
    return None if value is None else int(value)


def public_job(job: Job) -> dict[str, Any]:
    """The job as ``/v1/jobs`` shows it."""
    return {
        "id": job.id,
        "object": "job",
        "endpoint": job.payload["endpoint"],
        "status": job.state,
        "priority": MAX_PRIORITY - job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "idempotency_key": job.idempotency_key,
        "batch_id": job.batch_id,
        "created_at": _seconds(job.created_at),
        "started_at": _seconds(job.started_at),
        "finished_at": _seconds(job.finished_at),
        "deadline": _seconds(job.deadline),
        "expires_at": _seconds(job.expires_at),
        "cancel_requested": job.is_cancel_requested,
        "worker": job.worker,  # who runs it now (host-pid-nonce): for operators
        "metadata": job.payload.get("metadata") or {},
        "result": job.result,
        "error": job.error,
    }
