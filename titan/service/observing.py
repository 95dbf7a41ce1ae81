"""Reporting each finished request: its metrics (latencies, goodput), one JSON log line, and the
timings a client asks for with ``x-titan-timings: 1`` (a header, and ``usage.titan_timings``)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson

from titan.config import TitanConfig
from titan.errors import TitanError
from titan.observability.metrics import TitanMetrics
from titan.observability.records import TIMINGS_HEADER, RequestRecord
from titan.observability.request_log import RequestLog
from titan.observability.tracing import Tracer, set_attributes
from titan.protocol import Answer, ClientRequest, RawJSON, answer_bytes
from titan.service.accounting import usage_of
from titan.service.streaming import close_stream

# Redaction of logged prompts and answers: what identifies people or grants access.
_REDACTIONS = (
    (re.compile(r"\b(?:sk|pk|rk|sk-titan)[-_][A-Za-z0-9_-]{8,}"), "[key]"),
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "[email]"),
    (re.compile(r"\+?\d[\d ()./-]{5,}\d"), "[number]"),
)
MAX_LOGGED_CHARS = 2000
# nginx's code for "client closed request", as the HTTP layer logs it.
CLIENT_CLOSED_REQUEST = 499


def redact(text: str) -> str:
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text[:MAX_LOGGED_CHARS]


class RequestObserver:
    def __init__(
        self,
        config: TitanConfig,
        metrics: TitanMetrics,
        tracer: Tracer | None = None,
        request_log: RequestLog | None = None,
    ):
        self.config = config.observability
        self.metrics = metrics
        self.tracer = tracer or Tracer()
        self.request_log = request_log or RequestLog()
        self._slos = {m.name: m.slo for m in config.models if m.slo is not None}

    def start(self, request: ClientRequest) -> RequestRecord:
        return RequestRecord(
            request.request_id,
            request.endpoint,
            is_stream=request.is_stream,
            is_timed=request.headers.get(TIMINGS_HEADER) == "1",
        )

    @contextlib.contextmanager
    def request_span(self, request: ClientRequest, record: RequestRecord) -> Iterator[Any]:
        """The request's root span (a child of the caller's ``traceparent``, if any); its trace
        id goes to the record, and so to the log line."""
        with self.tracer.span(
            "titan.request", parent_headers=request.headers, request_id=request.request_id,
            endpoint=request.endpoint, stream=request.is_stream,
        ) as span:  # fmt: skip
            record.trace_id = self.tracer.trace_id(span)
            try:
                yield span
            except TitanError as exc:
                set_attributes(span, status=exc.status_code, error_code=exc.code)
                raise

    def report(self, record: RequestRecord, content: dict[str, str] | None = None) -> None:
        """Once per request, whichever way it ended."""
        if not record.claim_report():
            return
        if self.config.request_metrics:
            self.metrics.observe(record, self._slos.get(record.model or "", self.config.slo))
        if self.config.log_requests:
            fields = record.log_fields()
            if self.config.log_content and content:
                fields["content"] = {k: redact(v) for k, v in content.items()}
            self.request_log.write(fields)

    def close(self) -> None:
        self.request_log.flush()

    @property
    def logs_content(self) -> bool:
        return self.config.log_requests and self.config.log_content


def timed_answer(answer: Answer, record: RequestRecord) -> Answer:
    """The answer with ``usage.titan_timings`` (only when the client asked: it re-encodes)."""
    try:
        body = orjson.loads(answer_bytes(answer))
    except orjson.JSONDecodeError:
        return answer
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return answer
    usage["titan_timings"] = record.timings()
    return RawJSON(orjson.dumps(body))


def answer_text(answer: Answer) -> str:
    """The answer's text, for a content log line."""
    try:
        body: Any = orjson.loads(answer_bytes(answer))
    except orjson.JSONDecodeError:
        return ""
    texts = []
    for choice in body.get("choices") or []:
        message = choice.get("message") or choice.get("delta") or {}
        texts.append(str(message.get("content") or choice.get("text") or ""))
    return "\n".join(texts)


def prompt_text(request: ClientRequest) -> str:
    """The request's last user message (or prompt), for a content log line."""
    body = request.body
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else orjson.dumps(content).decode()
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()


def logged_prompt(request: ClientRequest, record: RequestRecord) -> str:
    """A content log shows the prompt as redacted by the guardrails, never the original."""
    return record.redacted_prompt if record.redacted_prompt is not None else prompt_text(request)


def status_of(exc: BaseException) -> tuple[int, str | None]:
    if isinstance(exc, TitanError):
        return exc.status_code, exc.code or exc.error_type
    if isinstance(exc, asyncio.CancelledError):
        return CLIENT_CLOSED_REQUEST, "client_closed"
    return 500, "internal_error"


async def observed(
    stream: AsyncIterator[Answer],
    record: RequestRecord,
    observer: RequestObserver,
    content: dict[str, str] | None,
) -> AsyncIterator[Answer]:
    """The stream, timing its chunks and reporting its record when it ends."""
    try:
        async for chunk in stream:
            usage = usage_of(chunk)
            if usage is not None:
                record.prompt_tokens, record.completion_tokens = usage
                if record.is_timed:
                    record.total_s = record.elapsed()
                    chunk = timed_answer(chunk, record)
            else:
                record.chunk()
            yield chunk
    except BaseException as exc:
        record.failed(*status_of(exc))
        raise
    finally:
        await close_stream(stream)
        observer.report(record, content)
