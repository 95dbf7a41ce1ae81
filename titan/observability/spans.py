"""A trace span as Titan records it (a plain object, ~1 µs), and what an exporter takes.

Apart from the tracer so that an exporter (``tracing_export``) and the tracer that builds one
both depend on these types, not on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol


class SpanKind(IntEnum):
    """OTLP's span kinds (the values of its enum)."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3


@dataclass(slots=True)
class Span:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int  # 0: a root without a remote parent
    kind: SpanKind
    start_ns: int
    attributes: dict[str, Any]
    end_ns: int = 0
    error: str | None = None  # set when the block raised: OTLP status ERROR with this message

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def is_recording(self) -> bool:
        return self.end_ns == 0

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    def traceparent(self) -> str:
        """This span as a W3C ``traceparent`` (sampled), for a downstream call to join."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"


class SpanExporter(Protocol):
    def add(self, span: Span) -> None: ...

    def shutdown(self) -> None: ...
