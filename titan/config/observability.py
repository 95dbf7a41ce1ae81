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
    """OpenTelemetry spans for each pipeline step and upstream attempt, sent to an OTLP
    collector (needs the ``tracing`` extra: opentelemetry-sdk and its OTLP exporter)."""

    enabled: bool = False
    otlp_endpoint: str | None = None  # e.g. http://otel-collector:4318/v1/traces (OTLP/HTTP)
    service_name: str = "titan"
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
