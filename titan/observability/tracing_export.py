"""Finished spans to an OTLP/HTTP collector, as JSON, in batches sent from a thread.

The request path only appends a span to a list; a daemon thread wakes every
``schedule_delay_s`` (or when ``max_batch`` spans wait), encodes them with orjson in OTLP's JSON
shape (hex ids, string nanoseconds, typed attribute values) and POSTs them. A full queue drops
spans and counts them (tracing never slows or grows the gateway without bound); a collector that
fails is logged once per outage and its batch dropped, as the OpenTelemetry SDK does.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from titan.observability.spans import Span

logger = logging.getLogger(__name__)

SCOPE_NAME = "titan"
# OTLP's status codes.
_STATUS_ERROR = 2


def attribute_value(value: Any) -> dict[str, Any]:
    """An OTLP AnyValue: bools, ints (as strings: 64-bit), floats, else strings."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": attribute_value(value)} for key, value in values.items()]


def encode_span(span: Span) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "traceId": f"{span.trace_id:032x}",
        "spanId": f"{span.span_id:016x}",
        "name": span.name,
        "kind": int(span.kind),
        "startTimeUnixNano": str(span.start_ns),
        "endTimeUnixNano": str(span.end_ns),
        "attributes": _attributes(span.attributes),
    }
    if span.parent_span_id:
        encoded["parentSpanId"] = f"{span.parent_span_id:016x}"
    if span.error is not None:
        encoded["status"] = {"code": _STATUS_ERROR, "message": span.error}
    return encoded


def encode_request(spans: list[Span], resource: Mapping[str, Any]) -> bytes:
    """An ExportTraceServiceRequest in OTLP/JSON."""
    return orjson.dumps({
        "resourceSpans": [{
            "resource": {"attributes": _attributes(resource)},
            "scopeSpans": [{"scope": {"name": SCOPE_NAME},
                            "spans": [encode_span(span) for span in spans]}],
        }]
    })  # fmt: skip


def post_json(url: str, headers: Mapping[str, str], timeout_s: float) -> Callable[[bytes], None]:
    def send(body: bytes) -> None:
        request = urllib.request.Request(
            url, data=body, method="POST",
            headers={"Content-Type": "application/json", **headers},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the response open
            raise OSError(f"the collector answered {exc.code} {exc.reason}") from None

    return send


class OtlpExporter:
    def __init__(
        self,
        send: Callable[[bytes], None] | None,
        resource: Mapping[str, Any],
        *,
        schedule_delay_s: float = 1.0,
        max_batch: int = 512,
        max_queue: int = 8192,
    ):
        self._send = send  # None: spans are kept nowhere (tracing on, no endpoint configured)
        self.resource = dict(resource)
        self.schedule_delay_s = schedule_delay_s
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.num_dropped = 0
        self.num_exported = 0
        self._queue: list[Span] = []
        self._wake = threading.Condition()
        self._is_stopping = False
        self._is_failing = False
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, config: Any) -> OtlpExporter:
        send = None
        if config.otlp_endpoint:
            send = post_json(config.otlp_endpoint, config.otlp_headers, config.export_timeout_s)
        return cls(send, {"service.name": config.service_name})

    def add(self, span: Span) -> None:
        if self._send is None or self._is_stopping:
            return
        queue = self._queue
        if len(queue) >= self.max_queue:
            self.num_dropped += 1
            return
        queue.append(span)
        if self._thread is None:
            self._start()
        elif len(queue) == self.max_batch:
            with self._wake:
                self._wake.notify()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="titan-trace-export", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._is_stopping and len(self._queue) < self.max_batch:
                    self._wake.wait(self.schedule_delay_s)
                is_stopping = self._is_stopping
            self._export_queued()
            if is_stopping:
                return

    def _export_queued(self) -> None:
        # Swapping the list is atomic under the GIL: add() appends to the new one meanwhile.
        spans, self._queue = self._queue, []
        for start in range(0, len(spans), self.max_batch):
            self._export(spans[start : start + self.max_batch])

    def _export(self, batch: list[Span]) -> None:
        send = self._send
        if send is None:
            return
        try:
            send(encode_request(batch, self.resource))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            if not self._is_failing:
                logger.warning("trace export failed; dropping spans until it recovers: %s", exc)
            self._is_failing = True
            self.num_dropped += len(batch)
            return
        if self._is_failing:
            logger.info("trace export recovered")
        self._is_failing = False
        self.num_exported += len(batch)

    def shutdown(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._wake:
            self._is_stopping = True
            self._wake.notify()
        thread.join()
        self._thread = None
