"""A chaos run's report: ``report.json`` (everything: the scenario as run, the faults as they
happened, the timelines, the verdicts, every request) and ``report.html`` (the same as charts)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import orjson

from titan.chaos.measures import Scope
from titan.chaos.runner import ChaosResult
from titan.chaos.windows import around_faults, request_numbers, timeline

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


def report_data(result: ChaosResult) -> dict[str, Any]:
    scenario, seen = result.scenario, result.observations
    whole = Scope(((0.0, seen.duration_s),))
    return {
        "scenario": {
            "name": scenario.name,
            "description": scenario.description,
            "source": result.source,
            "time_scale": result.time_scale,
            "as_run": scenario.model_dump(mode="json"),
        },
        "started_at": result.started_at,
        "wall_s": round(result.wall_s, 3),
        "passed": result.passed,
        "assertions": [verdict.as_dict() for verdict in result.verdicts],
        "summary": request_numbers(seen, whole),
        "faults": around_faults(seen, result.occurrences, scenario.report.window_s),
        "windows": timeline(seen, scenario.report.window_s, result.occurrences),
        "breaker_samples": [
            {
                "at_s": round(s.at_s, 3),
                "replica": s.replica,
                "is_up": s.is_up,
                "states": s.breaker_states,
            }
            for s in seen.titan
        ],
        "final_stats": result.final_stats,
        "systems": {"commands": result.commands, "titan_configs": result.titan_configs},
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "requests": {
            "columns": ["sent_s", "outcome", "e2e_s", "ttft_s", "model", "replica"],
            "rows": [record.as_row() for record in seen.requests],
        },
    }


def write_report(result: ChaosResult, output: Path) -> tuple[Path, Path]:
    """Writes report.json and report.html into ``output``; returns their paths."""
    from titan.chaos.html import render_html  # plotly: only when a report is written

    output.mkdir(parents=True, exist_ok=True)
    data = report_data(result)
    json_path = output / REPORT_JSON
    json_path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    html_path = output / REPORT_HTML
    html_path.write_text(render_html(data), encoding="utf-8")
    return json_path, html_path
