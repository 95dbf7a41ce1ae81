"""``python -m benchmarks loadgen``: its report on made-up results, then (slow) a very short run end
to end. No timing thresholds: the one-core target belongs to the report, not to tests."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest

from benchmarks import loadgen_bench as lb
from benchmarks import loadgen_report as lr
from benchmarks import results_file
from benchmarks.base import measure

OTHER_START, OTHER_END = results_file.markers("jobs")
OTHER = f"# Benchmark results\n\n{OTHER_START}\n## Jobs\n\nkept\n{OTHER_END}\n"


def cell(rps: float, cores: float, *, scheduled: int = 0, ok: int = 0) -> dict:
    return {
        "rps": rps,
        "num_errors": 0,
        "client_cores": cores,
        "num_ok": ok or int(rps),
        "client_cpu_us_per_request": 1e6 * cores / rps,
        "server_cores": 0.5,
        "p50_ms": 1.5,
        "p99_ms": 3.0,
        "num_scheduled": scheduled,
        "wall_s": 1.0,
    }


def fake_results(open_cores: float = 0.2, answered: int = 1000) -> dict:
    settings = lb.LoadgenSettings.quick(wrk="/usr/bin/wrk")
    machine = {
        "cpu_model": "cpu",
        "num_cores": 2,
        "platform": "linux",
        "load_average_before": 0.1,
        "load_average_after": 0.2,
    }
    modes = {
        mode: {
            "cells": {
                "open": cell(1000, open_cores, scheduled=1000, ok=answered),
                "closed": cell(5000, 0.3),
                "wrk": cell(7000, 0.15),
            },
            "body": lb.request_body(settings, mode == "streaming"),
            "wrk_command": "wrk -c32 http://127.0.0.1:1/v1/chat/completions",
        }
        for mode in lb.MODES
    }
    results = {
        "meta": {
            "started_at": "now",
            "command": "python -m benchmarks loadgen --quick",
            "settings": asdict(settings),
            "machine": machine,
            "versions": {
                "python": "3",
                "titan": "0.1",
                "uvloop": "0.2",
                "uvicorn": "0.5",
                "wrk": "wrk 4",
            },
        },
        "profile": lb.simulator_profile(settings),
        "simulator_command": "titan simulate",
        "modes": modes,
    }
    results["targets"] = lr.targets(results)
    return results


def test_targets():
    checks = {t["name"]: t for t in lr.targets(fake_results())}
    cores = checks["load generator cores at 1000 requests/s, streaming"]
    assert (cores["value"], cores["passed"]) == (0.2, True)
    ratio = checks["CPU per request, load generator ÷ wrk, non-streaming"]
    assert ratio["value"] == pytest.approx((0.3 / 5000) / (0.15 / 7000)) and ratio["passed"] is None
    slow = {t["name"]: t for t in lr.targets(fake_results(open_cores=1.3, answered=900))}
    assert slow["load generator cores at 1000 requests/s, non-streaming"]["passed"] is False
    assert slow["answered ÷ scheduled at 1000/s, non-streaming"]["value"] == pytest.approx(90)
    assert slow["answered ÷ scheduled at 1000/s, non-streaming"]["passed"] is False


def test_markdown_section_replaces_only_its_own(tmp_path: Path):
    path = tmp_path / "RESULTS.md"
    path.write_text(OTHER)
    markdown = lr.render_markdown(fake_results(), json_name="out/loadgen.json")
    results_file.write_section(path, markdown, lr.NAME)
    text = path.read_text()
    assert "kept" in text and text.count("<!-- loadgen-bench:start -->") == 1
    assert "| load generator cores at 1000 requests/s, streaming | 0.20 | ≤ 1 | PASS |" in text
    assert "Quick variant" in text and "wrk (baseline), closed loop" in text
    assert "Raw numbers (every run's full summary): `out/loadgen.json`." in text


@pytest.mark.slow
def test_a_tiny_run_end_to_end(tmp_path: Path):
    settings = lb.LoadgenSettings.quick(
        duration_s=0.5, warmup_s=0.2, rate=200, wrk=shutil.which("wrk")
    )
    messages: list[str] = []
    outcome = measure(lr.BENCHMARK, settings, tmp_path / "RESULTS.md", messages.append, "test")
    results = orjson.loads(outcome.json_path.read_bytes())
    for mode in lb.MODES:
        cells = results["modes"][mode]["cells"]
        assert cells["open"]["num_failed"] == 0 and cells["open"]["num_ok"] > 50
        assert 0 < cells["open"]["client_cores"] < 2
        assert cells["closed"]["num_ok"] > 0
        assert ("wrk" in cells) == (settings.wrk is not None)
    assert "<!-- loadgen-bench:end -->" in outcome.markdown_path.read_text()
    assert any("open loop at 200/s" in message for message in messages)
