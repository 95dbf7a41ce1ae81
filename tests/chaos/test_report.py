"""Timeline windows, the numbers around each fault, and the written report (JSON and an HTML
page that fetches nothing)."""

from __future__ import annotations

import re

import orjson
import pytest

from tests.chaos.factories import request, scenario_data
from titan.chaos.faults import Occurrence
from titan.chaos.records import BackendSample, Observations, TitanSample
from titan.chaos.report import write_report
from titan.chaos.runner import ChaosResult
from titan.chaos.scenario_files import scenario_from_mapping
from titan.chaos.verdicts import judge_all
from titan.chaos.windows import around_faults, timeline, window_bounds

SLOW = Occurrence("slow", "latency_spike", "b", (2.0, 5.0), started_s=2.0, ended_s=5.0)


def seen() -> Observations:
    requests = [request(i * 0.5, ttft_s=0.05) for i in range(20)]
    requests += [request(3.2, "503", e2e_s=0.01), request(3.4, ttft_s=0.9)]
    titan = [
        TitanSample(t, "titan-1", True, {"chat/a": 0, "chat/b": 2 if 3 <= t < 4 else 0},
                    {"chat/a": 0, "chat/b": int(t >= 3)}, {"retries": float(t >= 3)})
        for t in (0.0, 1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0)
    ]  # fmt: skip
    backends = [BackendSample(t, "b", t != 3.5, int(t * 2), 1, 0) for t in (0.0, 1.0, 3.5, 4.0)]
    return Observations(10.0, sorted(requests, key=lambda r: r.sent_s), titan, backends)


def test_window_bounds_cover_the_run():
    assert window_bounds(2.5, 1.0) == [(0, 1), (1, 2), (2, 2.5)]
    assert window_bounds(2.0, 1.0) == [(0, 1), (1, 2)]


def test_windows_carry_requests_breakers_and_faults():
    windows = timeline(seen(), 1.0, [SLOW])
    assert len(windows) == 10
    third = windows[3]
    assert (third["requests"], third["ok"], third["errors"]) == (4, 3, {"503": 1})
    assert third["p99_ttft_ms"] == pytest.approx(900, rel=0.2)
    assert third["breakers"] == {"chat/a": 0, "chat/b": 2} and windows[4]["breakers"]["chat/b"] == 0
    assert third["retries"] == 1 and third["faults"] == ["slow"] and windows[5]["faults"] == []
    assert third["backends"]["b"]["is_down"] is True
    assert windows[7]["requests"] == 2 and windows[7]["p99_ttft_ms"] == pytest.approx(50)


def test_around_each_fault():
    (slow,) = around_faults(seen(), [SLOW], 1.0)
    phases = slow["phases"]
    assert [(p["start_s"], p["end_s"]) for p in phases.values()] == [(0, 2), (2, 5), (5, 8)]
    assert phases["during"]["errors"] == {"503": 1} and phases["before"]["errors"] == {}


def result(passed_check: str) -> ChaosResult:
    scenario = scenario_from_mapping(scenario_data(assertions=[passed_check]), "s.yaml")
    observations = seen()
    return ChaosResult(
        scenario=scenario, source="s.yaml", time_scale=1.0, started_at="now", wall_s=1.0,
        observations=observations, occurrences=[SLOW],
        verdicts=judge_all(scenario, observations, [SLOW]), commands={"a": "titan simulate"},
        titan_configs={},
    )  # fmt: skip


def test_the_report_files(tmp_path):
    json_path, html_path = write_report(result("error_rate <= 0.1"), tmp_path)
    data = orjson.loads(json_path.read_bytes())
    assert data["passed"] is True and data["assertions"][0]["measured"] == pytest.approx(1 / 22)
    assert data["faults"][0]["id"] == "slow" and len(data["windows"]) == 10
    assert len(data["requests"]["rows"]) == 22
    page = html_path.read_text()
    assert "PASSED" in page and "error_rate &lt;= 0.1" in page
    # Offline: plotly's code is inlined, no script or stylesheet is fetched from anywhere.
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page
    assert "Plotly.newPlot" in page and len(page) > 1_000_000


def test_a_failed_report(tmp_path):
    json_path, html_path = write_report(result("error_rate == 0"), tmp_path)
    assert orjson.loads(json_path.read_bytes())["passed"] is False
    assert "FAILED" in html_path.read_text()
