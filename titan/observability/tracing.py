"""OpenTelemetry spans for each pipeline step and upstream attempt — or nothing at all.

Tracing is an optional extra (``pip install 'titan[tracing]'``): with ``observability.tracing``
enabled and OpenTelemetry installed, a ``Tracer`` owns its own ``TracerProvider`` (never the
process-wide one: no global state) exporting to the configured OTLP/HTTP endpoint; otherwise
every ``span`` is a no-op context that costs a function call. An incoming W3C ``traceparent``
header makes Titan's request span a child of the caller's.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)


class Tracer:
    def __init__(self, config: Any = None, rng: random.Random | None = None):
        self._tracer: Any = None
        self.provider: Any = None
        self._rng = rng or random.Random()
        if config is None or not config.enabled:
            return
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        except ImportError:
            logger.warning(
                "observability.tracing is enabled but OpenTelemetry is not installed: "
                "pip install 'titan[tracing]'; tracing stays off"
            )
            return
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            # A caller's trace keeps its own sampling decision; new traces are sampled here
            # (``_samples``), before any span object exists, so an unsampled request costs
            # nothing.
            sampler=ParentBased(ALWAYS_ON),
        )
        self.sample_ratio = config.sample_ratio
        if config.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint)
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("titan")
        from opentelemetry.trace import get_current_span

        self._current_span = get_current_span

    @property
    def is_on(self) -> bool:
        return self._tracer is not None

    @contextlib.contextmanager
    def span(
        self, name: str, *, parent_headers: Mapping[str, str] | None = None, **attributes: Any
    ) -> Iterator[Any]:
        """A span around the block: a request's root span when ``parent_headers`` is given (a
        child of their ``traceparent``, if any), else a child of the current span, made only
        when that one is sampled. Yields it, or None when there is none."""
        if self._tracer is None:
            yield None
            return
        if parent_headers is None and not self._current_span().is_recording():
            yield None  # a step of a request not sampled: no span at all, at no cost
            return
        is_root = parent_headers is not None
        if is_root and "traceparent" not in parent_headers and not self._samples():  # type: ignore[operator]
            yield None
            return
        context = None
        if parent_headers and "traceparent" in parent_headers:
            from opentelemetry.propagate import extract

            context = extract(parent_headers)
        attrs = {k: v for k, v in attributes.items() if v is not None}
        with self._tracer.start_as_current_span(name, context=context, attributes=attrs) as span:
            yield span

    def _samples(self) -> bool:
        return self.sample_ratio >= 1 or self._rng.random() < self.sample_ratio

    def trace_id(self, span: Any) -> str | None:
        """The span's trace id as 32 hex digits (what the request log line carries)."""
        if span is None:
            return None
        context = span.get_span_context()
        return f"{context.trace_id:032x}" if context.is_valid else None

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def set_attributes(span: Any, **attributes: Any) -> None:
    if span is not None:
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
