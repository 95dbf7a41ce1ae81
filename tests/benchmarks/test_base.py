"""The Benchmark interface's shared half: the record every benchmark's results carry (when, the
command, the settings, the machine, the versions), measured once; the JSON and the RESULTS.md
section written, other sections kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from benchmarks.base import Benchmark, measure
from benchmarks.results_file import markers, quick_note

START, END = markers("toy")


@dataclass(frozen=True)
class ToySettings:
    size: int = 10
    is_quick: bool = False


def toy_run(settings: ToySettings, progress) -> dict:
    progress("measuring")
    extra = {"versions": {"toolkit": "7"}, "machine": {"gpu": "none"}, "settings": {"double": 20}}
    return {"meta": extra, "values": list(range(settings.size))}


def toy_markdown(results: dict, json_name: str) -> str:
    meta = results["meta"]
    body = [*quick_note(meta), f"{len(results['values'])} values with `{meta['command']}`"]
    return "\n".join([START, *body, f"raw: {json_name}", END])


def toy_targets(results: dict) -> list[dict]:
    return [
        {"name": "values", "passed": len(results["values"]) == results["meta"]["settings"]["size"]}
    ]


TOY = Benchmark("toy", toy_run, toy_markdown, targets=toy_targets, packages=("titan", "orjson"))


def test_measure_records_once_and_writes_both_files(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(
        "# Benchmark results\n\n<!-- other-bench:start -->\nkept\n<!-- other-bench:end -->\n"
    )
    messages: list[str] = []
    outcome = measure(TOY, ToySettings(), output, messages.append, command="toy --now")
    meta = outcome.results["meta"]
    assert messages == ["measuring"]
    assert meta["command"] == "toy --now" and meta["started_at"]
    assert meta["settings"] == {"size": 10, "is_quick": False, "double": 20}
    assert {"python", "titan", "orjson", "toolkit"} <= set(meta["versions"])
    assert meta["machine"]["gpu"] == "none" and "load_average_before" in meta["machine"]
    assert outcome.results["targets"] == [{"name": "values", "passed": True}]
    assert outcome.json_path.parent == tmp_path / "out"
    assert outcome.json_path.name.startswith("toy-")
    assert orjson.loads(outcome.json_path.read_bytes()) == outcome.results
    text = output.read_text()
    assert "kept" in text and "10 values with `toy --now`" in text and "Quick variant" not in text
    measure(TOY, ToySettings(size=3, is_quick=True), output, command="toy --quick")
    again = output.read_text()
    assert again.count(START) == 1 and "3 values" in again and "Quick variant" in again
    assert "kept" in again
