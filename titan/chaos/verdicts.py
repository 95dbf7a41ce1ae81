"""A scenario's assertions judged against a run: each assertion's scope (the whole run, a window,
or the occurrences of a fault as they happened, extended by ``extend_s``), then its check."""

from __future__ import annotations

from collections.abc import Sequence

from titan.chaos.checks import Verdict, judge, parse_check
from titan.chaos.faults import Occurrence
from titan.chaos.measures import Scope, Slo, union
from titan.chaos.records import Observations
from titan.chaos.scenario import AssertionSpec, Scenario


def scope_of(
    assertion: AssertionSpec, duration_s: float, occurrences: Sequence[Occurrence]
) -> tuple[Scope, str]:
    """The intervals the assertion looks at, and how the report says it."""
    if assertion.window is not None:
        start, end = assertion.window
        intervals: tuple[tuple[float, float], ...] = ((start, min(end, duration_s)),)
        text = f"window {start:g}-{end:g} s"
    elif assertion.during is not None:
        extend_s = assertion.extend_s
        intervals = union(
            [
                (start, min(duration_s, end + extend_s))
                for occurrence in occurrences
                if occurrence.fault_id == assertion.during
                for start, end in [occurrence.interval(duration_s)]
            ]
        )
        text = f"during {assertion.during}" + (f" (+{extend_s:g} s)" if extend_s else "")
    else:
        intervals, text = ((0.0, duration_s),), "whole run"
    if assertion.model is not None:
        text += f", model {assertion.model}"
    return Scope(intervals, assertion.model), text


def judge_all(
    scenario: Scenario, seen: Observations, occurrences: Sequence[Occurrence]
) -> list[Verdict]:
    slo = Slo(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.e2e_s)
    verdicts = []
    for assertion in scenario.assertions:
        scope, text = scope_of(assertion, seen.duration_s, occurrences)
        check = parse_check(assertion.check)
        verdicts.append(
            judge(
                check,
                name=assertion.name or str(check),
                scope=scope,
                scope_text=text,
                seen=seen,
                slo=slo,
            )
        )
    return verdicts
