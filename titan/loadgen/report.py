"""A load test's report: ``report.json`` (every run's summary, the knee, how it was run) and
``report.html``, one offline page with plotly charts of throughput, latency and concurrency
against the load. Plotly's JavaScript is inlined from the installed ``plotly`` package (never
a CDN), so the page opens anywhere, without a network."""

from __future__ import annotations

import html
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import orjson

from titan.loadgen.console import LATENCIES, point_lines
from titan.loadgen.sweep import MIN_ATTAINMENT, SweepPoint

PLOTLY_BUNDLE = "plotly.min.js"
JSON_NAME, HTML_NAME = "report.json", "report.html"


def build_report(
    points: Sequence[SweepPoint], knee: SweepPoint | None, meta: dict[str, Any]
) -> dict[str, Any]:
    kinds = {point.summary["arrivals"]["kind"] for point in points}
    sweep = None
    if len(points) > 1:
        sweep = "rate" if kinds == {"open"} else "concurrency"
    return {
        "meta": meta,
        "sweep": sweep,
        "min_attainment": MIN_ATTAINMENT,
        "knee": None if knee is None else {"load": knee.load, **knee.summary["arrivals"]},
        "points": [point.summary for point in points],
    }


def write_report(directory: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    """``report.json`` and ``report.html`` in ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, html_path = directory / JSON_NAME, directory / HTML_NAME
    json_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    html_path.write_text(render_html(report), encoding="utf-8")
    return json_path, html_path


def plotly_js() -> str:
    """plotly.min.js as the installed ``plotly`` package ships it (found without importing it:
    the Python package takes seconds to import and is not needed)."""
    spec = find_spec("plotly")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "package_data" / PLOTLY_BUNDLE
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError("plotly's JavaScript bundle is missing: install the 'plotly' package")


# ---- figures ---------------------------------------------------------------------------------


def _line(x: list[Any], y: list[Any], name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines+markers", "x": x, "y": y, "name": name, **extra}


def _ms(values: list[float | None]) -> list[float | None]:
    return [None if v is None else v * 1000 for v in values]


def _layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "xaxis": {"title": {"text": x_title}},
            "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
            "margin": {"t": 50, "r": 20, "b": 110},
            "legend": {"orientation": "h", "y": -0.3}, **extra}  # fmt: skip


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Plotly figure specs (data and layout): throughput, latency and concurrency against the
    load; latency against throughput; SLO attainment with the knee."""
    points = report["points"]
    load = [p["load"] for p in points]
    is_rate = all(p["arrivals"]["kind"] == "open" for p in points)
    load_title = "offered rate (requests/s)" if is_rate else "concurrency (clients)"
    achieved = [p["request_throughput"] for p in points]
    latency = [
        _line(load, _ms([p[key][q] for p in points]), f"{label} {q}",
              line={"dash": "dot" if q == "p99" else "solid"})
        for key, label in LATENCIES for q in ("p50", "p99")
    ]  # fmt: skip
    e2e_vs_throughput = [
        _line(achieved, _ms([p["e2e_s"][q] for p in points]), f"E2E {q}") for q in ("p50", "p99")
    ] + [_line(achieved, _ms([p["ttft_s"]["p99"] for p in points]), "TTFT p99")]
    attainment = [_line(load, [100 * (p["slo_attainment"] or 0) for p in points],
                        "SLO attainment (%)")]  # fmt: skip
    floor = 100 * MIN_ATTAINMENT
    knee_shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": floor, "y1": floor,
                    "line": {"dash": "dash", "color": "gray"}}]  # fmt: skip
    if report.get("knee"):
        knee_x = report["knee"]["load"]
        knee_shapes.append({"type": "line", "yref": "paper", "y0": 0, "y1": 1, "x0": knee_x,
                            "x1": knee_x, "line": {"dash": "dash", "color": "green"}})  # fmt: skip
    return [
        {"id": "throughput", "data": [
            _line(load, achieved, "requests/s"),
            _line(load, [p["goodput"] for p in points], "goodput (requests/s)"),
            _line(load, [p["output_throughput"] for p in points], "output tokens/s",
                  yaxis="y2"),
        ], "layout": _layout("Throughput", load_title, "requests/s", yaxis2={
            "title": {"text": "output tokens/s"}, "overlaying": "y", "side": "right",
            "rangemode": "tozero"})},
        {"id": "latency", "data": latency,
         "layout": _layout("Latency percentiles", load_title, "ms")},
        {"id": "latency-throughput", "data": e2e_vs_throughput,
         "layout": _layout("Latency against throughput", "achieved requests/s", "ms")},
        {"id": "concurrency", "data": [
            _line(load, [p["mean_concurrency"] for p in points], "mean in flight"),
            _line(load, [p["max_concurrency"] for p in points], "most in flight"),
        ], "layout": _layout("Requests in flight", load_title, "requests")},
        {"id": "attainment", "data": attainment,
         "layout": _layout("SLO attainment and the knee", load_title, "% of requests",
                           shapes=knee_shapes, yaxis={"range": [0, 105],
                                                      "title": {"text": "% of requests"}})},
    ]  # fmt: skip


# ---- the page --------------------------------------------------------------------------------


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element."""
    return orjson.dumps(value).decode().replace("</", "<\\/")


def _points_table(report: dict[str, Any]) -> str:
    rows = []
    for point in report["points"]:
        lines = "<br>".join(html.escape(line) for line in point_lines(point))
        label = html.escape(f"{point['arrivals']['kind']} loop, load {point['load']:g}")
        rows.append(f"<tr><th>{label}</th><td>{lines}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def render_html(report: dict[str, Any]) -> str:
    meta = report["meta"]
    knee = report.get("knee")
    knee_text = "none of the runs" if knee is None else f"load {knee['load']:g}"
    title = f"titan bench {meta.get('url', '')}"
    specs = figures(report)
    divs = "".join(f'<div class="chart" id="{spec["id"]}"></div>' for spec in specs)
    plots = "".join(
        f"Plotly.newPlot({_script_json(spec['id'])}, {_script_json(spec['data'])}, "
        f"{_script_json(spec['layout'])}, {{responsive: true, displaylogo: false}});"
        for spec in specs
    )
    about = "".join(
        f"<li><b>{html.escape(str(key))}</b>: {html.escape(str(value))}</li>"
        for key, value in meta.items() if not isinstance(value, dict)
    )  # fmt: skip
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px}}
.chart{{height:420px;margin-bottom:1em}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:.4em;text-align:left;vertical-align:top}}</style>
<script>{plotly_js()}</script></head><body>
<h1>{html.escape(title)}</h1><ul>{about}</ul>
<p>Knee (the highest load with at least {MIN_ATTAINMENT:.0%} SLO attainment):
<b>{html.escape(knee_text)}</b>.</p>
{divs}<h2>Runs</h2>{_points_table(report)}
<script>{plots}</script></body></html>
"""
