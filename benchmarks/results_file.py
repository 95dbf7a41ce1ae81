"""bench/RESULTS.md holds one section per benchmark, each between its own markers; a run
replaces its section and keeps the others. Raw numbers go to JSON files beside it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

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
