"""Tracing: a span per request with its steps and upstream attempts as children, joined to the
caller's trace by ``traceparent``, its trace id in the request's log line; and nothing at all
when tracing is off."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from titan.config import config_from_mapping
from titan.observability.tracing import Tracer
from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.service import build_pipeline

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


def request(headers: dict[str, str]) -> ClientRequest:
    body = {"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return ClientRequest(endpoint="chat", parsed=ChatCompletionRequest.model_validate(body),
                         body=body, request_id="req-traced", headers=headers)  # fmt: skip


@pytest.fixture
async def traced_pipeline():
    config = config_from_mapping({
        "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
        "probes": {"enabled": False}, "storage": "memory://", "jobs": {"workers": 0},
        "observability": {"tracing": {"enabled": True}},
    }, "test")  # fmt: skip
    pipeline = build_pipeline(config)
    exporter = InMemorySpanExporter()
    pipeline.tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
    await pipeline.start()
    yield pipeline, exporter
    await pipeline.shutdown()


async def test_a_request_span_has_its_steps_and_attempts_and_joins_the_callers_trace(
    traced_pipeline, caplog
):
    pipeline, exporter = traced_pipeline
    caplog.set_level(logging.INFO, logger="titan.requests")
    await pipeline.complete(request({"traceparent": TRACEPARENT}))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {"titan.request", "titan.authenticate", "titan.route", "titan.admission",
            "titan.attempt"} <= set(spans)  # fmt: skip
    root = spans["titan.request"]
    assert f"{root.context.trace_id:032x}" == PARENT_TRACE  # a child of the caller's span
    assert root.attributes["deployment"] == "sim-0" and root.attributes["attempts"] == 1
    for name in ("titan.authenticate", "titan.admission", "titan.attempt"):
        assert spans[name].parent.span_id == root.context.span_id
    assert spans["titan.attempt"].attributes["deployment"] == "sim-0"
    (line,) = [r for r in caplog.records if r.name == "titan.requests"]
    assert line.trace_id == PARENT_TRACE


async def test_without_a_caller_trace_a_new_one_starts(traced_pipeline):
    pipeline, exporter = traced_pipeline
    await pipeline.complete(request({}))
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "titan.request"]
    assert root.parent is None and root.context.trace_id != int(PARENT_TRACE, 16)


def test_tracing_off_is_a_no_op():
    tracer = Tracer(None)
    with tracer.span("anything", a=1) as span:
        assert span is None
    assert not tracer.is_on and tracer.trace_id(None) is None
