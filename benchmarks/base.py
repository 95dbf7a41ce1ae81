"""One interface for every benchmark here: its settings (a frozen dataclass with a ``quick()``
variant), its workload (``run``, which reports progress) and its report (a RESULTS.md section,
console tables, the targets it judges). ``measure`` does the rest once for all of them: it records
when, with what command, on which machine (load average before and after) and with which
versions, writes the raw numbers to ``bench/out/NAME-<stamp>.json`` and the section between the
benchmark's markers in RESULTS.md, keeping every other section."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.results_file import (
    default_command,
    display_path,
    json_path_for,
    machine_info,
    package_versions,
    write_json,
    write_section,
)

Progress = Callable[[str], None]
Results = dict[str, Any]
Tables = dict[str, tuple[list[str], list[list[str]]]]


@dataclass(frozen=True)
class Benchmark:
    """``run(settings, progress)`` returns the measurements; a ``meta`` entry in them adds to
    the record ``measure`` keeps (``versions`` of tools such as wrk, ``machine`` extras,
    derived ``settings``). ``markdown(results, json_name)`` is the section, markers included;
    ``tables`` the console's (title -> header, rows)."""

    name: str  # the markers <!-- NAME-bench:start/end --> and the JSON file's prefix
    run: Callable[[Any, Progress], Results]
    markdown: Callable[[Results, str], str]
    tables: Callable[[Results], Tables] | None = None  # None: the console shows the section
    targets: Callable[[Results], list[dict[str, Any]]] | None = None
    packages: tuple[str, ...] = ("titan",)  # whose versions the record names


@dataclass(frozen=True)
class Outcome:
    results: Results
    markdown_path: Path
    json_path: Path


def record(benchmark: Benchmark, settings: Any, measured: Results, started: tuple[str, float],
           command: str | None = None) -> Results:  # fmt: skip
    """The results: ``measured`` under the record of how they were measured, then judged."""
    started_at, load_average_before = started
    extra = measured.pop("meta", {})
    meta = {
        "started_at": started_at,
        "command": command or default_command(),
        **extra,
        "settings": {**asdict(settings), **extra.get("settings", {})},
        "machine": {**machine_info(load_average_before), **extra.get("machine", {})},
        "versions": {**package_versions(*benchmark.packages), **extra.get("versions", {})},
    }
    results = {"meta": meta, **measured}
    if benchmark.targets is not None:
        results["targets"] = benchmark.targets(results)
    return results


def measure(
    benchmark: Benchmark,
    settings: Any,
    output: Path,
    progress: Progress = lambda _: None,
    command: str | None = None,
) -> Outcome:
    """Run ``benchmark``; its section into ``output``, its raw numbers into output's folder's
    out/NAME-<timestamp>.json."""
    started = (datetime.now(UTC).isoformat(timespec="seconds"), os.getloadavg()[0])
    measured = benchmark.run(settings, progress)
    results = record(benchmark, settings, measured, started, command)
    json_path = write_json(json_path_for(output.parent / "out", benchmark.name), results)
    section = benchmark.markdown(results, display_path(json_path))
    return Outcome(results, write_section(output, section, benchmark.name), json_path)
