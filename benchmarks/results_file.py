"""bench/RESULTS.md holds one section per benchmark, each between its own markers; a run
replaces its section and keeps the others. Raw numbers go to JSON files beside it, with the
machine and the versions they were measured with."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS_TITLE = "# Benchmark results\n"


def markers(benchmark: str) -> tuple[str, str]:
    return f"<!-- {benchmark}-bench:start -->", f"<!-- {benchmark}-bench:end -->"


def write_section(path: Path, section: str, benchmark: str) -> Path:
    """Put ``section`` (markers included) in ``path``: in place of the benchmark's previous
    section if there is one, else at the end. Everything else in the file stays as it was."""
    start_marker, end_marker = markers(benchmark)
    section = section.strip("\n")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{RESULTS_TITLE}\n{section}\n")
        return path
    text = path.read_text()
    start = text.find(start_marker)
    end = text.find(end_marker, start + 1) if start >= 0 else -1
    if start >= 0 and end >= 0:
        text = text[:start] + section + text[end + len(end_marker) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    return path


def json_path_for(out_dir: Path, benchmark: str, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return out_dir / f"{benchmark}-{stamp}.json"


def write_json(path: Path, results: dict[str, Any]) -> Path:
    import orjson

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return path


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def default_command() -> str:
    """How this run was started (``python -m benchmarks NAME ...``), to type it again."""
    return shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])


def _cpu_model() -> str:
    """The model name, with x86's family and model numbers (a VM's name can be as bare as
    "Intel(R) Xeon(R) Processor")."""
    try:
        fields = dict(
            (key.strip(), value.strip())
            for key, _, value in (line.partition(":") for line in _first_cpu_lines())
        )
    except OSError:
        fields = {}
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def _first_cpu_lines() -> list[str]:
    text = Path("/proc/cpuinfo").read_text()
    return text.split("\n\n", 1)[0].splitlines()


def machine_info(load_average_before: float) -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "num_cores": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_before": load_average_before,  # 1-minute load average
        "load_average_after": os.getloadavg()[0],
    }


def package_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def package_versions(*packages: str) -> dict[str, str]:
    """Python's version and each installed package's, for a benchmark's record."""
    return {"python": platform.python_version(), **{p: package_version(p) for p in packages}}


def targets_table(
    targets: list[dict[str, Any]], number: Callable[[float | None, int], str]
) -> tuple[list[str], list[list[str]]]:
    """The "Targets" table of a report: each check's measured value (``number`` formats it
    with the check's digits), its target and PASS / FAIL / info."""
    verdict = {True: "PASS", False: "FAIL", None: "info"}
    rows = [
        [t["name"], number(t["value"], t["digits"]) + (t["unit"] if t["value"] is not None else ""),
         t["target"], verdict[t["passed"]]]
        for t in targets
    ]  # fmt: skip
    return ["check", "measured", "target", "result"], rows


def check(name: str, value: float | None, target: str, passed: bool | None, unit: str = "",
          digits: int = 0) -> dict[str, Any]:  # fmt: skip
    """One target of a report: ``passed`` None for a number shown for information."""
    return {"name": name, "value": value, "target": target, "passed": passed, "unit": unit,
            "digits": digits}  # fmt: skip


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def quick_note(meta: dict[str, Any]) -> list[str]:
    """The warning a quick run's section opens with (its settings' ``is_quick``)."""
    if not meta["settings"].get("is_quick"):
        return []
    return [
        "> **Quick variant** (`--quick`): a smoke run of every phase on a tiny scale. Its numbers "
        "say nothing about the targets; run without `--quick` to measure.",
        "",
    ]


def opening_lines(
    start: str,
    title: str,
    meta: dict[str, Any],
    targets: tuple[list[str], list[list[str]]],
    note: str = "",
) -> list[str]:
    """A section up to its method: the start marker, the title, the quick warning, the record
    (``note`` after it), the targets table and the "### Method" heading."""
    return [start, f"## {title}", "", *quick_note(meta), *record_lines(meta, note), "",
            "### Targets", "", *markdown_table(*targets), "", "### Method", ""]  # fmt: skip


def record_lines(meta: dict[str, Any], note: str = "") -> list[str]:
    """A section's record: when, with what command, on which machine, with which versions
    (a package not installed or a tool not found left out); ``note`` follows on its line."""
    m = meta["machine"]
    versions = ", ".join(f"{name} {version}" for name, version in meta["versions"].items()
                         if version not in (None, "not installed"))  # fmt: skip
    return [
        f"Measured {meta['started_at']} with `{meta['command']}`.",
        f"Machine: {m['cpu_model']}, {m['num_cores']} cores, {m['platform']} (1-minute load "
        f"average {m['load_average_before']:.2f} before, {m['load_average_after']:.2f} after). "
        f"Versions: {versions}." + (f" {note}" if note else ""),
    ]
