"""Metrics, request logs and tracing."""

from __future__ import annotations

from pydantic import Field

from titan.config.settings import Settings


class SloConfig(Settings):
    """What a good answer is, for the goodput metric: within all of these (None: not judged)."""

    ttft_s: float | None = Field(2.0, gt=0)  # time to the first token (non-streamed: the answer)
    e2e_s: float | None = Field(60.0, gt=0)  # the whole request
    inter_token_s: float | None = Field(0.2, gt=0)  # mean gap between streamed tokens


class TracingConfig(Settings):
    """Spans for each request, pipeline step and upstream attempt, sent in OTLP/HTTP JSON to an
    OpenTelemetry collector (or Jaeger, Tempo, a vendor's OTLP endpoint)."""

    enabled: bool = False
    otlp_endpoint: str | None = None  # e.g. http://otel-collector:4318/v1/traces (OTLP/HTTP)
    # Sent with each export, e.g. {"authorization": "Bearer ..."} for a hosted collector.
    otlp_headers: dict[str, str] = Field(default_factory=dict)
    export_timeout_s: float = Field(10.0, gt=0)
    service_name: str = "titan"
    # New traces sampled; a caller's traceparent keeps the caller's decision.
    sample_ratio: float = Field(1.0, ge=0, le=1)


class ObservabilityConfig(Settings):
    # Per-request metrics (counts, latencies, goodput); off only to measure what they cost.
    request_metrics: bool = True
    # One JSON line per request on the "titan.requests" logger.
    log_requests: bool = True
    # Prompts and answers in those lines too, redacted (emails, numbers, keys): off by default.
    log_content: bool = False
    slo: SloConfig = SloConfig()
    tracing: TracingConfig = TracingConfig()
