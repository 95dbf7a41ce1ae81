"""The metrics assertions name, measured over a scope: intervals of the timeline (the whole run,
a window, a fault's occurrences) and optionally one model of the load.

Request metrics count the requests *sent* in the scope. Latency percentiles are over successful
requests, except ``wait`` (every request's end-to-end time, failures included: how long its user
waited for an outcome). Titan's and the backends' counters are their increase over the scope,
summed over replicas; ``backend_peak_*`` the largest sampled value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from titan.chaos.records import OPEN, Observations, RequestRecord, increase
from titan.loadgen.metrics import percentile

Interval = tuple[float, float]  # [start_s, end_s) on the timeline

LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
LATENCIES = ("ttft", "tpot", "itl", "e2e", "wait")
_LATENCY = re.compile(rf"^({'|'.join(LATENCY_STATS)})_({'|'.join(LATENCIES)})_ms$")
# name -> whether it takes an argument (required: True, optional: None, none: False)
REQUEST_METRICS = {
    "requests": False,
    "rps": False,
    "ok_rps": False,
    "success_rate": False,
    "error_rate": None,
    "errors": None,
    "slo_attainment": False,
    "goodput_rps": False,
}
TITAN_METRICS = {
    "retries": False,
    "hedges": False,
    "fallbacks": False,
    "breaker_openings": True,
    "breaker_open_share": True,
}
BACKEND_METRICS = {"backend_requests": True, "backend_peak_busy": True, "backend_peak_queued": True}
TITAN_COUNTERS = ("retries", "hedges", "fallbacks")


def takes_argument(metric: str) -> bool | None:
    """True: needs one; None: may take one; False: takes none. KeyError: no such metric."""
    if _LATENCY.match(metric):
        return False
    for table in (REQUEST_METRICS, TITAN_METRICS, BACKEND_METRICS):
        if metric in table:
            return table[metric]
    raise KeyError(metric)


def metric_names(*, expanded: bool = False) -> list[str]:
    """Every metric; the latencies as one pattern unless ``expanded``."""
    if expanded:
        latencies = [f"{stat}_{name}_ms" for stat in LATENCY_STATS for name in LATENCIES]
    else:
        latencies = [f"{{{','.join(LATENCY_STATS)}}}_{{{','.join(LATENCIES)}}}_ms"]
    return [*REQUEST_METRICS, *latencies, *TITAN_METRICS, *BACKEND_METRICS]


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def is_met_by(self, record: RequestRecord) -> bool:
        if not record.is_ok:
            return False
        if self.ttft_s is not None and (record.ttft_s is None or record.ttft_s > self.ttft_s):
            return False
        if self.e2e_s is not None and record.e2e_s > self.e2e_s:
            return False
        return self.tpot_s is None or record.tpot_s is None or record.tpot_s <= self.tpot_s


@dataclass(frozen=True)
class Scope:
    intervals: tuple[Interval, ...]
    model: str | None = None

    @property
    def length_s(self) -> float:
        return sum(end - start for start, end in self.intervals)

    def contains(self, at_s: float) -> bool:
        return any(start <= at_s < end for start, end in self.intervals)

    def requests(self, records: Sequence[RequestRecord]) -> list[RequestRecord]:
        return [
            r
            for r in records
            if self.contains(r.sent_s) and (self.model is None or r.model == self.model)
        ]


def union(intervals: Sequence[Interval]) -> tuple[Interval, ...]:
    """Sorted, overlapping intervals merged."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def measure(
    metric: str, argument: str | None, scope: Scope, seen: Observations, slo: Slo
) -> float | None:
    """The metric's value over the scope; None where there is nothing to measure."""
    latency = _LATENCY.match(metric)
    if latency is not None:
        return _latency_ms(latency.group(1), latency.group(2), scope.requests(seen.requests))
    if metric in REQUEST_METRICS:
        return _request_metric(metric, argument, scope, seen.requests, slo)
    if metric in TITAN_METRICS:
        return _titan_metric(metric, argument, scope, seen)
    return _backend_metric(metric, argument or "", scope, seen)


def _latency_ms(stat: str, quantity: str, records: list[RequestRecord]) -> float | None:
    ok = [r for r in records if r.is_ok]
    values: list[float]
    if quantity == "ttft":
        values = [r.ttft_s for r in ok if r.ttft_s is not None]
    elif quantity == "tpot":
        values = [r.tpot_s for r in ok if r.tpot_s is not None]
    elif quantity == "itl":
        values = [gap for r in ok for gap in r.itl_s]
    elif quantity == "e2e":
        values = [r.e2e_s for r in ok]
    else:  # wait: every request, failed or not
        values = [r.e2e_s for r in records]
    if not values:
        return None
    values.sort()
    if stat == "mean":
        value = sum(values) / len(values)
    elif stat == "max":
        value = values[-1]
    else:
        value = percentile(values, float(stat[1:]))
    return value * 1000


def _request_metric(
    metric: str, argument: str | None, scope: Scope, records: Sequence[RequestRecord], slo: Slo
) -> float | None:
    chosen = scope.requests(records)
    length_s = scope.length_s
    num_ok = sum(r.is_ok for r in chosen)
    if metric == "requests":
        return float(len(chosen))
    if metric == "errors":
        return float(sum(_is_error(r, argument) for r in chosen))
    if metric in ("rps", "ok_rps", "goodput_rps"):
        if length_s <= 0:
            return None
        count = {"rps": len(chosen), "ok_rps": num_ok}.get(metric)
        if count is None:
            count = sum(slo.is_met_by(r) for r in chosen)
        return count / length_s
    if not chosen:
        return None
    if metric == "success_rate":
        return num_ok / len(chosen)
    if metric == "error_rate":
        return sum(_is_error(r, argument) for r in chosen) / len(chosen)
    return sum(slo.is_met_by(r) for r in chosen) / len(chosen)  # slo_attainment


def _is_error(record: RequestRecord, kind: str | None) -> bool:
    return not record.is_ok if kind is None else record.outcome == kind


def _titan_metric(
    metric: str, argument: str | None, scope: Scope, seen: Observations
) -> float | None:
    replicas = sorted({sample.replica for sample in seen.titan})
    if not replicas:
        return None
    if metric in TITAN_COUNTERS:
        return sum(
            _increase(
                scope,
                [
                    (s.at_s, s.counters.get(metric, 0.0))
                    for s in seen.titan
                    if s.replica == replica and s.is_up
                ],
            )
            for replica in replicas
        )
    matches = _deployment_matcher(argument or "")
    if metric == "breaker_openings":
        total = 0.0
        for replica in replicas:
            points = [
                (s.at_s, float(sum(n for key, n in s.breaker_openings.items() if matches(key))))
                for s in seen.titan
                if s.replica == replica and s.is_up
            ]
            total += _increase(scope, points)
        return total
    states = [
        max((state for key, state in s.breaker_states.items() if matches(key)), default=None)
        for s in seen.titan
        if s.is_up and scope.contains(s.at_s)
    ]
    known = [state for state in states if state is not None]
    return sum(state == OPEN for state in known) / len(known) if known else None


def _deployment_matcher(argument: str) -> Callable[[str], bool]:
    """ "a" matches deployment a of every model; "chat/a" only model chat's."""
    if "/" in argument:
        return lambda key: key == argument
    return lambda key: key.split("/", 1)[-1] == argument


def _backend_metric(metric: str, backend: str, scope: Scope, seen: Observations) -> float | None:
    samples = [s for s in seen.backends if s.backend == backend]
    if not samples:
        return None
    if metric == "backend_requests":
        return _increase(scope, [(s.at_s, float(s.num_requests)) for s in samples if s.is_up])
    attribute = "num_busy" if metric == "backend_peak_busy" else "num_queued"
    values = [getattr(s, attribute) for s in samples if s.is_up and scope.contains(s.at_s)]
    return float(max(values)) if values else None


def _increase(scope: Scope, points: list[tuple[float, float]]) -> float:
    return sum(increase(points, start, end) for start, end in scope.intervals)
