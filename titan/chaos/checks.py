"""Assertions: ``METRIC[(ARG)] OP NUMBER`` parsed once (when the scenario loads) and judged
against what the run observed, over the scope the assertion names.

``p99_ttft_ms <= 500``, ``error_rate(429) == 0``, ``breaker_openings(b) >= 1``. A metric with
nothing to measure in its scope (no requests there, no samples) fails: an assertion that cannot
be checked has not passed.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from titan.chaos.measures import Interval, Scope, Slo, measure, metric_names, takes_argument
from titan.chaos.records import Observations

_CHECK = re.compile(
    r"^\s*(?P<metric>[a-z0-9_]+)\s*(?:\(\s*(?P<arg>[^()\s]+)\s*\))?\s*"
    r"(?P<op><=|>=|==|!=|<|>)\s*(?P<number>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$"
)
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Check:
    metric: str
    argument: str | None
    op: str
    threshold: float

    @property
    def subject(self) -> str:
        return self.metric if self.argument is None else f"{self.metric}({self.argument})"

    def __str__(self) -> str:
        return f"{self.subject} {self.op} {self.threshold:g}"


def parse_check(text: str) -> Check:
    """Raises ValueError saying what is wrong, with the metric names when it is unknown."""
    match = _CHECK.match(text)
    if match is None:
        raise ValueError(
            f"cannot read check {text!r}: expected METRIC[(ARG)] OP NUMBER, "
            "e.g. 'p99_ttft_ms <= 500' (OP: <=, >=, <, >, ==, !=)"
        )
    metric, argument = match["metric"], match["arg"]
    try:
        needs = takes_argument(metric)
    except KeyError:
        close = difflib.get_close_matches(metric, metric_names(expanded=True), n=1)
        hint = (
            f"; did you mean {close[0]!r}?" if close else f" (metrics: {', '.join(metric_names())})"
        )
        raise ValueError(f"unknown metric {metric!r}{hint}") from None
    if needs is True and argument is None:
        raise ValueError(f"{metric} needs an argument: {metric}(NAME)")
    if needs is False and argument is not None:
        raise ValueError(f"{metric} takes no argument")
    return Check(metric, argument, match["op"], float(match["number"]))


@dataclass(frozen=True)
class Verdict:
    name: str
    check: str
    scope: str  # in words: "whole run", "during spikes (+1 s)", "window 10-20 s"
    intervals: tuple[Interval, ...]
    measured: float | None
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "check": self.check,
            "scope": self.scope,
            "intervals": [list(interval) for interval in self.intervals],
            "measured": self.measured,
            "passed": self.passed,
            "detail": self.detail,
        }


def judge(
    check: Check,
    *,
    name: str,
    scope: Scope,
    scope_text: str,
    seen: Observations,
    slo: Slo,
) -> Verdict:
    measured = measure(check.metric, check.argument, scope, seen, slo)
    if measured is None:
        passed, detail = False, "nothing to measure in this scope"
    else:
        passed = OPERATORS[check.op](measured, check.threshold)
        detail = f"{check.subject} = {_show(measured)}"
    return Verdict(name, str(check), scope_text, scope.intervals, measured, passed, detail)


def _show(value: float) -> str:
    return f"{value:.4g}" if value != int(value) or abs(value) >= 1e6 else f"{int(value)}"


def all_passed(verdicts: Sequence[Verdict]) -> bool:
    return all(verdict.passed for verdict in verdicts)
