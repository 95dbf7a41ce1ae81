"""``titan bench URL`` on the terminal: a progress bar per run, a table per run, a sweep's table
and its knee (rich)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from titan.loadgen.arrivals import Arrivals
from titan.loadgen.client import Sample
from titan.loadgen.sweep import MIN_ATTAINMENT, SweepPoint

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))
STATS = ("mean", "p50", "p90", "p95", "p99")
# Refreshing the bar on every answer would cost more than the answers at 1,000 requests/s.
UPDATE_INTERVAL_S = 0.1


class LiveProgress:
    """A bar per run (time, or requests with --num-requests), answers and failures so far."""

    def __init__(self, console: Console, duration_s: float | None, num_requests: int | None):
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.duration_s, self.num_requests = duration_s, num_requests
        self.progress: Progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[answered]} answered, {task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
            transient=True,  # a finished run's bar gives way to its table
        )
        self._task: TaskID | None = None
        self._started = self._last_update = 0.0
        self._num_answered = self._num_failed = 0

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.finish_point()
        self.progress.stop()

    def finish_point(self) -> None:
        if self._task is not None:
            self.progress.remove_task(self._task)
            self._task = None

    def start_point(self, index: int, arrivals: Arrivals) -> None:
        self.finish_point()
        self._num_answered = self._num_failed = 0
        self._started = self._last_update = time.monotonic()
        total = self.num_requests if self.duration_s is None else self.duration_s
        self._task = self.progress.add_task(arrivals.describe(), total=total, answered=0,
                                            failed=0)  # fmt: skip

    def on_sample(self, sample: Sample) -> None:
        if sample.is_ok:
            self._num_answered += 1
        else:
            self._num_failed += 1
        if time.monotonic() - self._last_update >= UPDATE_INTERVAL_S:
            self._update()

    def _update(self) -> None:
        if self._task is None:
            return
        self._last_update = now = time.monotonic()
        done = self._num_answered + self._num_failed
        if self.duration_s is not None:
            completed = min(now - self._started, self.duration_s)
        else:
            completed = done
        self.progress.update(self._task, completed=completed, answered=self._num_answered,
                             failed=self._num_failed)  # fmt: skip


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def point_lines(summary: dict[str, Any]) -> list[str]:
    """The run's counts and throughputs, a line each."""
    attainment = summary["slo_attainment"]
    slo = {key: value for key, value in summary["slo"].items() if value is not None}
    slo_text = ", ".join(f"{key.removesuffix('_s').upper()} ≤ {value * 1000:g} ms"
                         for key, value in slo.items()) or "none (every answer counts)"  # fmt: skip
    errors = ", ".join(f"{key}: {count}" for key, count in summary["errors"].items())
    lines = [
        f"requests: {summary['num_requests']:,} ({summary['num_ok']:,} answered, "
        f"{summary['num_failed']:,} failed{f': {errors}' if errors else ''}) "
        f"in {summary['wall_s']:.1f} s",
        f"request throughput {_num(summary['request_throughput'], 2)}/s, output "
        f"{_num(summary['output_throughput'])} tokens/s, mean concurrency "
        f"{_num(summary['mean_concurrency'])}",
        f"SLO: {slo_text}; goodput {_num(summary['goodput'], 2)}/s, attainment "
        f"{'–' if attainment is None else f'{attainment:.1%}'}",
    ]
    if summary["error_reasons"]:
        reasons = ", ".join(f"{reason} ({count})" for reason, count in
                            summary["error_reasons"].items())  # fmt: skip
        lines.append(f"failures: {reasons}")
    return lines


def print_point(console: Console, point: SweepPoint) -> None:
    from rich.table import Table

    summary = point.summary
    table = Table(title=f"{point.arrivals.describe()}: latency (ms)", title_justify="left")
    table.add_column("metric")
    for name in STATS:
        table.add_column(name, justify="right")
    for key, label in LATENCIES:
        table.add_row(label, *(_ms(summary[key][name]) for name in STATS))
    console.print(table)
    for line in point_lines(summary):
        console.print(f"  {line}")


def print_sweep(console: Console, points: Sequence[SweepPoint], knee: SweepPoint | None) -> None:
    from rich import box
    from rich.table import Table

    is_rate = bool(points) and points[0].summary["arrivals"]["kind"] == "open"
    table = Table(title="Sweep (latencies in ms)", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("rate" if is_rate else "clients", "req/s", "good/s", "SLO", "TTFT\np50",
                   "TTFT\np99", "E2E\np50", "E2E\np99", "failed"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    for point in points:
        s = point.summary
        style = "bold green" if point is knee else None
        table.add_row(
            f"{point.load:g}", _num(s["request_throughput"], 2), _num(s["goodput"], 2),
            f"{point.attainment:.0%}", _ms(s["ttft_s"]["p50"]), _ms(s["ttft_s"]["p99"]),
            _ms(s["e2e_s"]["p50"]), _ms(s["e2e_s"]["p99"]), f"{s['num_failed']:,}", style=style,
        )  # fmt: skip
    console.print(table)
    console.print(knee_text(points, knee))


def knee_text(points: Sequence[SweepPoint], knee: SweepPoint | None) -> str:
    what = "rate" if points and points[0].summary["arrivals"]["kind"] == "open" else "concurrency"
    if knee is None:
        return (f"Knee: none — no {what} reached {MIN_ATTAINMENT:.0%} SLO attainment "
                "(lower the load or loosen the SLOs).")  # fmt: skip
    unit = " requests/s" if what == "rate" else ""
    return (
        f"Knee: {what} {knee.load:g}{unit}, the highest with ≥ {MIN_ATTAINMENT:.0%} SLO "
        f"attainment ({knee.attainment:.1%}, goodput {knee.summary['goodput']:.2f}/s)."
    )
