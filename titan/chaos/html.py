"""report.html: the verdicts, the faults as they happened, and the timelines as plotly charts
(requests and errors, latency, breaker states, Titan's retries/hedges/fallbacks, each backend's
traffic), fault intervals shaded on every chart. Plotly's JavaScript is inlined from the
installed package, so the page works offline and fetches nothing."""

from __future__ import annotations

import html
from typing import Any

OUTCOME_COLOURS = {"ok": "#2ca02c", "transport": "#7f7f7f", "stream": "#9467bd"}
ERROR_PALETTE = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
FAULT_COLOURS = ("#ff9896", "#c5b0d5", "#ffbb78", "#98df8a", "#aec7e8", "#f7b6d2")
BREAKER_SCALE = [[0.0, "#2ca02c"], [0.5, "#ffbf00"], [1.0, "#d62728"]]  # closed, half, open

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; font-size: 14px; }
.pass { color: #2ca02c; font-weight: bold; } .fail { color: #d62728; font-weight: bold; }
.muted { color: #777; }
"""


def render_html(data: dict[str, Any]) -> str:
    scenario = data["scenario"]
    verdict = "PASSED" if data["passed"] else "FAILED"
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>titan chaos: {_e(scenario['name'])}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(scenario['name'])} — <span class='{verdict[:4].lower()}'>{verdict}</span></h1>",
        f"<p>{_e(scenario['description'])}</p>",
        f"<p class='muted'>{_e(scenario['source'])} · time scale {scenario['time_scale']:g} · "
        f"started {_e(data['started_at'])} · {data['wall_s']:.1f} s wall</p>",
        "<h2>Assertions</h2>",
        _assertions_table(data["assertions"]),
        "<h2>Faults</h2>",
        _faults_table(data["faults"]),
        "<h2>Timelines</h2>",
        _figure(data).to_html(full_html=False, include_plotlyjs=True),
        "<h2>Whole run</h2>",
        _summary_table(data["summary"]),
        "</body></html>",
    ]
    return "\n".join(parts)


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _assertions_table(assertions: list[dict[str, Any]]) -> str:
    if not assertions:
        return "<p class='muted'>No assertions.</p>"
    rows = [
        [
            f"<span class='{'pass' if a['passed'] else 'fail'}'>"
            f"{'pass' if a['passed'] else 'FAIL'}</span>",
            _e(a["check"]),
            _e(a["scope"]),
            _e("—" if a["measured"] is None else f"{a['measured']:.4g}"),
            _e(a["detail"]),
        ]
        for a in assertions
    ]
    return _table(["verdict", "check", "scope", "measured", "detail"], rows)


def _faults_table(faults: list[dict[str, Any]]) -> str:
    if not faults:
        return "<p class='muted'>No faults.</p>"
    rows = []
    for fault in faults:
        planned = fault["planned"]
        phases = fault["phases"]
        numbers = " · ".join(
            f"{name}: {p['requests']} req, {sum(p['errors'].values())} err, "
            f"p99 TTFT {_ms(p['p99_ttft_ms'])}"
            for name, p in phases.items()
        )
        rows.append(
            [
                _e(fault["id"]),
                _e(fault["kind"]),
                _e(fault["target"]),
                _e(f"{planned[0]:.2f}–{'end' if planned[1] is None else f'{planned[1]:.2f}'} s"),
                _e(_span(fault["started_s"], fault["ended_s"])),
                _e(numbers)
                + (f"<br><span class='fail'>{_e(fault['error'])}</span>" if fault["error"] else ""),
            ]
        )
    return _table(
        ["id", "kind", "target", "planned", "as it happened", "before · during · after"], rows
    )


def _summary_table(summary: dict[str, Any]) -> str:
    rows = [[_e(key), _e(value)] for key, value in summary.items()]
    return _table(["", "whole run"], rows)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} ms"


def _span(started: float | None, ended: float | None) -> str:
    if started is None:
        return "did not start"
    return f"{started:.2f}–{'end' if ended is None else f'{ended:.2f}'} s"


def _figure(data: dict[str, Any]) -> Any:
    from plotly.subplots import make_subplots

    windows = data["windows"]
    x = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
    titles = (
        "requests per window (by outcome)",
        "latency of successful requests (ms)",
        "circuit breakers (green closed, amber half-open, red open)",
        "Titan: retries, hedges, fallbacks per window",
        "requests per backend per window",
    )
    figure = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,
        subplot_titles=titles,
        vertical_spacing=0.05,
        row_heights=[0.24, 0.24, 0.16, 0.18, 0.18],
    )
    _requests(figure, windows, x)
    _latency(figure, windows, x)
    _breakers(figure, windows, x)
    for name in ("retries", "hedges", "fallbacks"):
        figure.add_scatter(
            x=x,
            y=[w[name] for w in windows],
            name=name,
            row=4,
            col=1,
            mode="lines+markers",
            legendgroup="titan",
        )
    backends = sorted({name for w in windows for name in w["backends"]})
    for name in backends:
        figure.add_scatter(
            x=x,
            y=[w["backends"][name]["requests"] for w in windows],
            name=f"backend {name}",
            row=5,
            col=1,
            mode="lines+markers",
            legendgroup="backends",
        )
    _shade_faults(figure, data["faults"])
    figure.update_layout(
        height=1250, barmode="stack", margin={"t": 40, "b": 40}, legend={"orientation": "v"}
    )
    figure.update_xaxes(title_text="seconds on the scenario's timeline", row=5, col=1)
    return figure


def _requests(figure: Any, windows: list[dict[str, Any]], x: list[float]) -> None:
    figure.add_bar(
        x=x,
        y=[w["ok"] for w in windows],
        name="ok",
        row=1,
        col=1,
        marker_color=OUTCOME_COLOURS["ok"],
    )
    outcomes = sorted({kind for w in windows for kind in w["errors"]})
    for index, outcome in enumerate(outcomes):
        colour = OUTCOME_COLOURS.get(outcome, ERROR_PALETTE[index % len(ERROR_PALETTE)])
        label = outcome if not outcome.isdigit() else f"HTTP {outcome}"
        figure.add_bar(
            x=x,
            y=[w["errors"].get(outcome, 0) for w in windows],
            name=label,
            row=1,
            col=1,
            marker_color=colour,
        )


def _latency(figure: Any, windows: list[dict[str, Any]], x: list[float]) -> None:
    for name, dash in (
        ("p50_ttft_ms", "dot"),
        ("p99_ttft_ms", "solid"),
        ("p50_e2e_ms", "dot"),
        ("p99_e2e_ms", "solid"),
    ):
        figure.add_scatter(
            x=x,
            y=[w[name] for w in windows],
            name=name.removesuffix("_ms"),
            row=2,
            col=1,
            mode="lines+markers",
            line={"dash": dash},
            connectgaps=False,
        )


def _breakers(figure: Any, windows: list[dict[str, Any]], x: list[float]) -> None:
    keys = sorted({key for w in windows for key in w["breakers"]})
    if not keys:
        return
    z = [[w["breakers"].get(key) for w in windows] for key in keys]
    figure.add_heatmap(
        x=x,
        y=keys,
        z=z,
        zmin=0,
        zmax=2,
        colorscale=BREAKER_SCALE,
        showscale=False,
        row=3,
        col=1,
        xgap=1,
        ygap=2,
        hovertemplate="%{y} at %{x:.1f} s: %{z}<extra></extra>",
    )


def _shade_faults(figure: Any, faults: list[dict[str, Any]]) -> None:
    colours: dict[str, str] = {}
    for fault in faults:
        colour = colours.setdefault(fault["id"], FAULT_COLOURS[len(colours) % len(FAULT_COLOURS)])
        start = fault["started_s"] if fault["started_s"] is not None else fault["planned"][0]
        end = fault["ended_s"] if fault["ended_s"] is not None else fault["planned"][1]
        if end is None:
            end = _last_measured_s(fault)
        figure.add_vrect(
            x0=start,
            x1=max(end, start + 0.01),
            fillcolor=colour,
            opacity=0.35,
            layer="below",
            line_width=0,
            row="all",
            col=1,
        )
        figure.add_annotation(
            x=start,
            y=1.0,
            xref="x",
            yref="paper",
            text=_e(fault["id"]),
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"size": 10},
        )


def _last_measured_s(fault: dict[str, Any]) -> float:
    """A fault that lasts until the run ends: shaded to the last phase it was measured in."""
    phases = fault["phases"]
    return max((phase["end_s"] for phase in phases.values()), default=fault["planned"][0])
