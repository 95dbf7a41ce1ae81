"""The span exporter: OTLP/JSON that the official protobuf schema accepts, batches from a
thread to a real HTTP collector, bounded memory, and failures that drop spans without raising;
and W3C traceparent parsing."""

from __future__ import annotations

import base64
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from titan.config.observability import TracingConfig
from titan.observability.spans import Span, SpanKind
from titan.observability.tracing import Tracer, parse_traceparent
from titan.observability.tracing_export import OtlpExporter, encode_request


def span(name: str = "titan.request", **attributes) -> Span:
    return Span(name, 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 0x1234,
                SpanKind.SERVER, 1_700_000_000_000_000_000, attributes,
                end_ns=1_700_000_000_005_000_000)  # fmt: skip


def as_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON into the protobuf message. OTLP writes ids in hex where protobuf's JSON mapping
    expects base64: converted first, as a collector does."""
    document = orjson.loads(body)
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for item in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in item:
                        item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
    return json_format.Parse(orjson.dumps(document), ExportTraceServiceRequest())


def test_encoded_spans_follow_the_otlp_schema():
    failed = span("titan.attempt", deployment="d", attempt=2, stream=False, score=0.5)
    failed.error = "UpstreamTimeoutError: no first byte"
    message = as_protobuf(encode_request([span(), failed], {"service.name": "titan"}))
    (resource,) = message.resource_spans
    assert resource.resource.attributes[0].value.string_value == "titan"
    root, attempt = resource.scope_spans[0].spans
    assert root.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert root.span_id.hex() == "00f067aa0ba902b7" and root.parent_span_id.hex().endswith("1234")
    assert root.kind == 2 and root.end_time_unix_nano - root.start_time_unix_nano == 5_000_000
    values = {a.key: a.value for a in attempt.attributes}
    assert values["deployment"].string_value == "d" and values["attempt"].int_value == 2
    assert values["stream"].bool_value is False and values["score"].double_value == 0.5
    assert attempt.status.code == 2 and "no first byte" in attempt.status.message


class Collector:
    """A real OTLP/HTTP endpoint on loopback that keeps what it is sent."""

    def __init__(self, status: int = 200):
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.bodies.append(body)
                collector.content_types.append(self.headers["Content-Type"])
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def num_spans(self) -> int:
        return sum(len(s.spans) for body in self.bodies
                   for r in as_protobuf(body).resource_spans for s in r.scope_spans)  # fmt: skip

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    running = Collector()
    yield running
    running.close()


def test_a_tracer_exports_its_spans_in_batches_to_a_collector(collector):
    config = TracingConfig(enabled=True, otlp_endpoint=collector.url, service_name="gw",
                           otlp_headers={"x-tenant": "t1"})  # fmt: skip
    tracer = Tracer(config)
    tracer.exporter.max_batch = 4  # type: ignore[union-attr]
    for _ in range(5):
        with tracer.span("titan.request", parent_headers={}), tracer.span("titan.route"):
            pass
    tracer.shutdown()  # sends what is left
    assert collector.num_spans() == 10 and len(collector.bodies) >= 3
    assert set(collector.content_types) == {"application/json"}
    assert tracer.exporter.num_exported == 10  # type: ignore[union-attr]


def test_a_failing_collector_drops_spans_and_logs_once(caplog):
    broken = Collector(status=503)
    exporter = OtlpExporter.from_config(
        TracingConfig(enabled=True, otlp_endpoint=broken.url, export_timeout_s=2)
    )
    try:
        exporter._export([span()])
        exporter._export([span(), span()])
    finally:
        broken.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "trace export failed" in warnings[0].getMessage()
    assert exporter.num_dropped == 3 and exporter.num_exported == 0


def test_a_full_queue_drops_rather_than_grows():
    exporter = OtlpExporter(lambda body: None, {}, max_queue=3, schedule_delay_s=60)
    try:
        for _ in range(5):
            exporter.add(span())
        assert exporter.num_dropped == 2
    finally:
        exporter.shutdown()
    assert exporter.num_exported == 3


def test_unsampled_requests_make_no_spans():
    exporter = OtlpExporter(lambda body: None, {})
    tracer = Tracer(TracingConfig(enabled=True, sample_ratio=0.0), exporter=exporter)
    with tracer.span("titan.request", parent_headers={}) as root, tracer.span("step") as step:
        assert root is None and step is None
    exporter.shutdown()
    assert exporter.num_exported == 0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", (True, 0x00F067AA0BA902B7)),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00", (False, 0x00F067AA0BA902B7)),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # invalid trace id
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),  # invalid version
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None),
        ("garbage", None),
        ("", None),
    ],
)
def test_traceparent_parsing(header, expected):
    parent = parse_traceparent(header)
    if expected is None:
        assert parent is None
    else:
        assert (parent.is_sampled, parent.span_id) == expected
        assert parent.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
