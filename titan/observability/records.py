"""What one request did, collected on its way through the pipeline and reported once at its
end: to the metrics (counts, latencies, goodput), to the log (one JSON line), and to the client
when it asks (``x-titan-timings: 1``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

TIMINGS_HEADER = "x-titan-timings"


@dataclass
class RequestRecord:
    request_id: str
    endpoint: str
    is_stream: bool = False
    started: float = field(default_factory=time.monotonic)
    tenant: str | None = None
    model: str | None = None
    deployment: str | None = None
    priority: str | None = None
    num_attempts: int = 0
    cache: str = "none"  # "hit-exact", "hit-semantic", "miss" or "none" (not looked up)
    status: int = 200
    error_code: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    queue_s: float | None = None  # waiting for an admission slot
    ttft_s: float | None = None  # to the first token (the whole answer when not streamed)
    total_s: float | None = None
    num_chunks: int = 0  # streamed chunks with content
    inter_token_s: list[float] = field(default_factory=list)  # gaps between content chunks
    trace_id: str | None = None
    is_timed: bool = False  # the client asked for x-titan-timings
    # The prompt as the model saw it, when a guardrail rewrote it: what a content log may show.
    redacted_prompt: str | None = None
    _last_chunk_at: float | None = None
    _is_reported: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def first_byte(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = self.elapsed()

    def chunk(self) -> None:
        """A streamed chunk with content arrived."""
        now = time.monotonic()
        if self._last_chunk_at is not None:
            self.inter_token_s.append(now - self._last_chunk_at)
        else:
            self.ttft_s = self.ttft_s if self.ttft_s is not None else now - self.started
        self._last_chunk_at = now
        self.num_chunks += 1

    def failed(self, status: int, code: str | None) -> None:
        self.status, self.error_code = status, code

    def claim_report(self) -> bool:
        """True the first time: a record is reported once, however its request ended."""
        if self._is_reported:
            return False
        self._is_reported = True
        if self.total_s is None:
            self.total_s = self.elapsed()
        return True

    def timings(self) -> dict[str, float | None]:
        return {
            "queue_s": _rounded(self.queue_s),
            "ttft_s": _rounded(self.ttft_s),
            "total_s": _rounded(self.total_s if self.total_s is not None else self.elapsed()),
        }

    def timings_header(self) -> str:
        """``queue=0.001;ttft=0.120;total=0.500`` (seconds; "-" for what is not known yet)."""
        parts = []
        for name, value in self.timings().items():
            parts.append(f"{name.removesuffix('_s')}={'-' if value is None else value}")
        return ";".join(parts)

    def log_fields(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "stream": self.is_stream,
            "tenant": self.tenant,
            "model": self.model,
            "deployment": self.deployment,
            "priority": self.priority,
            "attempts": self.num_attempts,
            "cache": self.cache,
            "status": self.status,
            "error_code": self.error_code,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            **self.timings(),
            "trace_id": self.trace_id,
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
