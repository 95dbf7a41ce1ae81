"""The report: JSON with every run and the knee, and an offline HTML page with the curves."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from titan.loadgen import ClosedLoop, LoadRun, OpenLoop, Sample, Slo, SweepPoint, find_knee
from titan.loadgen import summarize as summarize_run
from titan.loadgen.report import build_report, figures, plotly_js, write_report


def sweep_point(rate: float, e2e_s: float) -> SweepPoint:
    samples = tuple(
        Sample(i / rate, 200, e2e_s, e2e_s / 4, 8, 20, (e2e_s / 10,) * 7) for i in range(int(rate))
    )
    run = LoadRun(samples, 1.0 + e2e_s, OpenLoop(rate), max_in_flight=3)
    return SweepPoint(run.arrivals, summarize_run(run, Slo(e2e_s=0.5)))


POINTS = [sweep_point(2, 0.2), sweep_point(4, 0.3), sweep_point(8, 0.9)]
META = {"url": "http://127.0.0.1:8000/v1", "model": "m", "workload": "chat"}


def test_the_report_holds_every_run_and_the_knee(tmp_path: Path):
    knee = find_knee(POINTS)
    json_path, html_path = write_report(tmp_path / "out", build_report(POINTS, knee, META))
    assert (json_path.name, html_path.name) == ("report.json", "report.html")
    report = orjson.loads(json_path.read_bytes())
    assert report["sweep"] == "rate" and report["min_attainment"] == 0.9
    assert report["knee"] == {
        "load": 4.0,
        "kind": "open",
        "rate": 4.0,
        "burstiness": 1.0,
        "seed": 0,
    }
    assert [p["load"] for p in report["points"]] == [2.0, 4.0, 8.0]
    assert report["meta"] == META


def test_the_html_page_is_offline_and_draws_the_curves(tmp_path: Path):
    report = build_report(POINTS, find_knee(POINTS), META)
    _, html_path = write_report(tmp_path, report)
    page = html_path.read_text()
    # Plotly's bundle is inlined: no script is loaded from anywhere.
    assert plotly_js() in page
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert "cdn." not in page.lower().replace(plotly_js().lower(), "")
    # Every curve is drawn, from the runs' numbers.
    for spec in figures(report):
        assert f'id="{spec["id"]}"' in page and f'Plotly.newPlot("{spec["id"]}"' in page
    throughput = next(spec for spec in figures(report) if spec["id"] == "throughput")
    assert throughput["data"][0]["x"] == [2.0, 4.0, 8.0]
    achieved = [p["request_throughput"] for p in report["points"]]
    assert throughput["data"][0]["y"] == achieved
    assert orjson.dumps(throughput["data"]).decode() in page
    assert "Knee" in page and "load 4" in page


def test_a_single_closed_loop_run_has_no_sweep():
    run = LoadRun((Sample(0, 200, 0.1, 0.05, 4, 1, (0.01,) * 3),), 0.5, ClosedLoop(2))
    only = SweepPoint(run.arrivals, summarize_run(run))
    report = build_report([only], find_knee([only]), META)
    assert report["sweep"] is None and report["knee"]["kind"] == "closed"
    latency = next(spec for spec in figures(report) if spec["id"] == "latency")
    assert latency["layout"]["xaxis"]["title"]["text"] == "concurrency (clients)"
