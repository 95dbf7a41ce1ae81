"""Tracing: a span per request with its steps and upstream attempts as children, joined to the
caller's trace by ``traceparent``, its trace id in the request's log line; and nothing at all
when tracing is off."""

from __future__ import annotations

import logging

import pytest

from titan.config import config_from_mapping
from titan.observability.spans import Span, SpanKind
from titan.observability.tracing import Tracer
from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.service import build_pipeline

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


def request(headers: dict[str, str]) -> ClientRequest:
    body = {"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return ClientRequest(endpoint="chat", parsed=ChatCompletionRequest.model_validate(body),
                         body=body, request_id="req-traced", headers=headers)  # fmt: skip


class CollectingExporter:
    def __init__(self):
        self.spans: list[Span] = []

    def add(self, span: Span) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass


@pytest.fixture
async def traced_pipeline():
    config = config_from_mapping({
        "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
        "probes": {"enabled": False}, "storage": "memory://", "jobs": {"workers": 0},
        "observability": {"tracing": {"enabled": True}},
    }, "test")  # fmt: skip
    pipeline = build_pipeline(config)
    exporter = CollectingExporter()
    pipeline.tracer.exporter = exporter
    await pipeline.start()
    yield pipeline, exporter
    await pipeline.shutdown()


async def test_a_request_span_has_its_steps_and_attempts_and_joins_the_callers_trace(
    traced_pipeline, caplog
):
    pipeline, exporter = traced_pipeline
    caplog.set_level(logging.INFO, logger="titan.requests")
    records = []
    pipeline.services.flow.observer.request_log.write = records.append
    await pipeline.services.flow.complete(request({"traceparent": TRACEPARENT}))
    spans = {span.name: span for span in exporter.spans}
    assert {"titan.request", "titan.authenticate", "titan.route", "titan.admission",
            "titan.attempt"} <= set(spans)  # fmt: skip
    root = spans["titan.request"]
    assert root.trace_id_hex == PARENT_TRACE  # a child of the caller's span
    assert root.parent_span_id == int(TRACEPARENT.split("-")[2], 16)
    assert root.kind == SpanKind.SERVER and spans["titan.attempt"].kind == SpanKind.CLIENT
    assert root.attributes["deployment"] == "sim-0" and root.attributes["attempts"] == 1
    for name in ("titan.authenticate", "titan.admission", "titan.attempt"):
        assert spans[name].parent_span_id == root.span_id
        assert spans[name].trace_id == root.trace_id
        assert root.start_ns <= spans[name].start_ns <= spans[name].end_ns <= root.end_ns
    assert spans["titan.attempt"].attributes["deployment"] == "sim-0"
    (line,) = records
    assert line["trace_id"] == PARENT_TRACE


async def test_without_a_caller_trace_a_new_one_starts(traced_pipeline):
    pipeline, exporter = traced_pipeline
    await pipeline.services.flow.complete(request({}))
    (root,) = [s for s in exporter.spans if s.name == "titan.request"]
    assert root.parent_span_id == 0 and root.trace_id not in (0, int(PARENT_TRACE, 16))


async def test_a_caller_that_did_not_sample_is_not_traced(traced_pipeline):
    pipeline, exporter = traced_pipeline
    await pipeline.services.flow.complete(request({"traceparent": TRACEPARENT[:-2] + "00"}))
    assert exporter.spans == []


def test_tracing_off_is_a_no_op():
    tracer = Tracer(None)
    with tracer.span("anything", a=1) as span:
        assert span is None
    assert not tracer.is_on and tracer.trace_id(None) is None


async def test_the_attempts_span_goes_upstream_as_the_traceparent(traced_pipeline, monkeypatch):
    pipeline, exporter = traced_pipeline
    (backend,) = pipeline.backends()
    sent = []
    original = backend.complete

    async def recording(upstream_request):
        sent.append(upstream_request)
        return await original(upstream_request)

    monkeypatch.setattr(backend, "complete", recording)
    await pipeline.services.flow.complete(request({"traceparent": TRACEPARENT}))
    (attempt,) = [span for span in exporter.spans if span.name == "titan.attempt"]
    assert sent[0].headers["traceparent"] == f"00-{PARENT_TRACE}-{attempt.span_id:016x}-01"
