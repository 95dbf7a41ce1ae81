"""The report's timelines: the run cut into windows (1 s unless the scenario says; scaled), each
with its requests, errors by kind, latency percentiles, breaker states, Titan's retries,
hedges and fallbacks and each backend's load, the faults in force marked; and for each fault
occurrence, the same numbers just before, during and just after it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from titan.chaos.faults import Occurrence
from titan.chaos.measures import Scope, Slo, measure
from titan.chaos.records import Observations, increase

LATENCIES = ("p50_ttft_ms", "p99_ttft_ms", "p50_e2e_ms", "p99_e2e_ms")


def window_bounds(duration_s: float, window_s: float) -> list[tuple[float, float]]:
    count = max(1, math.ceil(duration_s / window_s - 1e-9))
    return [(i * window_s, min((i + 1) * window_s, duration_s)) for i in range(count)]


def timeline(
    seen: Observations, window_s: float, occurrences: Sequence[Occurrence]
) -> list[dict[str, Any]]:
    return [
        _window(seen, start, end, occurrences)
        for start, end in window_bounds(seen.duration_s, window_s)
    ]


def _window(
    seen: Observations, start: float, end: float, occurrences: Sequence[Occurrence]
) -> dict[str, Any]:
    scope = Scope(((start, end),))
    return {
        "start_s": round(start, 4),
        "end_s": round(end, 4),
        **request_numbers(seen, scope),
        "breakers": _breakers(seen, start, end),
        **{
            name: measure(name, None, scope, seen, Slo())
            for name in ("retries", "hedges", "fallbacks")
        },
        "backends": _backends(seen, start, end),
        "replicas_down": sorted(
            {s.replica for s in seen.titan if start <= s.at_s < end and not s.is_up}
        ),
        "faults": sorted(
            {o.fault_id for o in occurrences if _overlaps(o.interval(seen.duration_s), start, end)}
        ),
    }


def request_numbers(seen: Observations, scope: Scope) -> dict[str, Any]:
    chosen = scope.requests(seen.requests)
    errors = Counter(r.outcome for r in chosen if not r.is_ok)
    return {
        "requests": len(chosen),
        "ok": len(chosen) - sum(errors.values()),
        "errors": dict(sorted(errors.items())),
        **{name: _rounded(measure(name, None, scope, seen, Slo())) for name in LATENCIES},
    }


def _breakers(seen: Observations, start: float, end: float) -> dict[str, int]:
    """The worst state sampled in the window, per "model/deployment", over the replicas."""
    worst: dict[str, int] = {}
    for sample in seen.titan:
        if sample.is_up and start <= sample.at_s < end:
            for key, state in sample.breaker_states.items():
                worst[key] = max(worst.get(key, 0), state)
    return dict(sorted(worst.items()))


def _backends(seen: Observations, start: float, end: float) -> dict[str, dict[str, Any]]:
    result = {}
    for name in sorted({s.backend for s in seen.backends}):
        samples = [s for s in seen.backends if s.backend == name]
        inside = [s for s in samples if start <= s.at_s < end]
        up = [s for s in inside if s.is_up]
        result[name] = {
            "requests": increase(
                [(s.at_s, float(s.num_requests)) for s in samples if s.is_up], start, end
            ),
            "peak_busy": max((s.num_busy for s in up), default=None),
            "peak_queued": max((s.num_queued for s in up), default=None),
            "is_down": bool(inside) and len(up) < len(inside),
        }
    return result


def around_faults(
    seen: Observations, occurrences: Sequence[Occurrence], window_s: float
) -> list[dict[str, Any]]:
    """Each occurrence's numbers before, during and after it (before and after: as long as
    it lasted, at least a window, within the run)."""
    result = []
    for occurrence in occurrences:
        start, end = occurrence.interval(seen.duration_s)
        span = max(end - start, window_s)
        phases = {
            "before": (max(0.0, start - span), start),
            "during": (start, max(end, start + window_s)),
            "after": (end, min(seen.duration_s, end + span)),
        }
        numbers = {
            phase: {
                "start_s": round(a, 4),
                "end_s": round(b, 4),
                **request_numbers(seen, Scope(((a, b),))),
            }
            for phase, (a, b) in phases.items()
            if b > a
        }
        result.append({**occurrence.as_dict(), "phases": numbers})
    return result


def _overlaps(interval: tuple[float, float], start: float, end: float) -> bool:
    return interval[0] < end and interval[1] > start


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
