"""What a chaos run observes, as plain data on the scenario's timeline (seconds from its 0):
each request of the load, Titan's state sampled from /metrics and /stats, and each simulated
backend's counters sampled from its /stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

TRANSPORT = "transport"  # no complete HTTP answer: refused, reset, cut, timed out, not sent
STREAM = "stream"  # a 200 whose stream ended in an error event (cut after the first byte)
OK = "ok"
# titan_circuit_state's values.
CLOSED, HALF_OPEN, OPEN = 0, 1, 2


class LoadSample(Protocol):
    """What the load generator reports for one request (titan.loadgen.Sample)."""

    sent_s: float
    status: int
    e2e_s: float
    ttft_s: float | None
    output_tokens: int
    itl_s: tuple[float, ...]
    error: str | None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    sent_s: float  # on the timeline
    outcome: str  # OK, an HTTP status ("429"), TRANSPORT or STREAM
    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None  # successful streams of two tokens or more
    itl_s: tuple[float, ...]
    model: str
    replica: str

    @property
    def is_ok(self) -> bool:
        return self.outcome == OK

    def as_row(self) -> list[Any]:
        ttft_s = None if self.ttft_s is None else round(self.ttft_s, 5)
        return [
            round(self.sent_s, 4),
            self.outcome,
            round(self.e2e_s, 5),
            ttft_s,
            self.model,
            self.replica,
        ]


def outcome_of(sample: LoadSample) -> str:
    if sample.status == 0:
        return TRANSPORT
    if not 200 <= sample.status < 300:
        return str(sample.status)
    return STREAM if sample.error is not None else OK


def record_of(sample: LoadSample, offset_s: float, model: str, replica: str) -> RequestRecord:
    """``offset_s``: when the sample's run started on the timeline."""
    outcome = outcome_of(sample)
    tpot_s = None
    if outcome == OK and sample.ttft_s is not None and sample.itl_s and sample.output_tokens > 1:
        tpot_s = (sample.e2e_s - sample.ttft_s) / (sample.output_tokens - 1)
    return RequestRecord(
        sent_s=offset_s + sample.sent_s,
        outcome=outcome,
        e2e_s=sample.e2e_s,
        ttft_s=sample.ttft_s,
        tpot_s=tpot_s,
        itl_s=tuple(sample.itl_s) if outcome == OK else (),
        model=model,
        replica=replica,
    )


@dataclass(frozen=True, slots=True)
class TitanSample:
    """One replica's state at ``at_s``; None values when it did not answer (dead)."""

    at_s: float
    replica: str
    is_up: bool
    breaker_states: dict[str, int] = field(default_factory=dict)  # "model/deployment" -> state
    breaker_openings: dict[str, int] = field(default_factory=dict)  # since the replica started
    counters: dict[str, float] = field(default_factory=dict)  # retries, hedges, fallbacks


@dataclass(frozen=True, slots=True)
class BackendSample:
    """A simulated backend's /stats at ``at_s`` (its counters restart with its process)."""

    at_s: float
    backend: str
    is_up: bool
    num_requests: int = 0
    num_busy: int = 0  # answers in service (not waiting for a slot)
    num_queued: int = 0


@dataclass(frozen=True)
class Observations:
    """Everything a run saw, for the windows, the assertions and the report."""

    duration_s: float
    requests: list[RequestRecord]
    titan: list[TitanSample]
    backends: list[BackendSample]


def increase(points: list[tuple[float, float]], start_s: float, end_s: float) -> float:
    """How much a counter grew over [start_s, end_s), from samples (time, value) in time order,
    a counter that restarted (a process killed and started again) counting from 0 again —
    Prometheus's ``increase``. The value before the window is the last sample before it."""
    total = 0.0
    previous: float | None = None
    for at_s, value in points:
        if at_s >= end_s:
            break
        if at_s < start_s:
            previous = value
            continue
        if previous is not None:
            total += value - previous if value >= previous else value
        previous = value
    return total
