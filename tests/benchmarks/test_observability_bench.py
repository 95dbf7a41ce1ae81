"""``python -m benchmarks observability``: its pieces and the report's structure on fake results;
then (slow) the quick variant end to end through the CLI. No timing thresholds: the throughput
target belongs to the report, not to tests."""

from __future__ import annotations

import urllib.request
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from benchmarks import observability_bench as ob
from benchmarks import observability_report as orp
from benchmarks import otlp_sink, results_file
from benchmarks.cli import build_app
from titan.config import config_from_mapping

OTHER_START, OTHER_END = results_file.markers("jobs")
OTHER = f"# Benchmark results\n\n{OTHER_START}\n## Jobs\n\nkept as it is\n{OTHER_END}\n"


def cell(rps: float, errors: int = 0) -> dict:
    return {"num_requests": int(rps * 2) + errors, "num_ok": int(rps * 2), "num_errors": errors,
            "errors": {"503": errors} if errors else {}, "wall_s": 2.0, "rps": rps,
            "num_retried": 0, "p50_ms": 32_000 / rps, "p90_ms": 40.0, "p99_ms": 64_000 / rps,
            "p999_ms": 70.0, "max_ms": 80.0, "titan_cpu_s": 1.0,
            "titan_cpu_ms_per_request": 500 / rps}  # fmt: skip


def run(round_number: int, config: str, rps: dict[str, float], errors: int = 0) -> dict:
    is_on = config == "on"
    return {
        "round": round_number, "config": config,
        "cells": {mode: cell(value, errors) for mode, value in rps.items()},
        "commands": {mode: f"wrk -c32 {mode}" for mode in rps},
        "metrics_requests": 4_000 if is_on else None, "peak_rss_mib": 100.0,
        "sink": {"batches": 40 if is_on else 0, "bytes": 2_048_000 if is_on else 0,
                 "spans": 24_000 if is_on else 0, "unparsed": 0, "other_requests": 0,
                 "cpu_s": 0.5 if is_on else 0.0},
        "log": {"lines": 8_010 if is_on else 2, "bytes": 3 * 2**20 if is_on else 200,
                "request_lines": 4_000 if is_on else 0, "access_lines": 4_000 if is_on else 0},
        "scrapes": {"scrapes": 4, "failures": 0, "bytes": 40_000, "max_ms": 3.5}
        if is_on else None,
    }  # fmt: skip


def fake_results(quick: bool = True, on_rps: float = 1_960.0, errors: int = 0) -> dict:
    settings = ob.ObservabilitySettings.quick() if quick else ob.ObservabilitySettings()
    machine = {"cpu_model": "cpu", "num_cores": 2, "platform": "linux",
               "load_average_before": 0.1, "load_average_after": 0.2}  # fmt: skip
    versions = {"python": "3", "titan": "0.1", "prometheus-client": "0.26",
                "orjson": "3.10", "uvicorn": "0.54", "wrk": None}  # fmt: skip
    runs = [
        run(1, "off", {"non-streaming": 2_000.0, "streaming": 1_000.0}),
        run(1, "on", {"non-streaming": on_rps, "streaming": 900.0}, errors),
        run(2, "off", {"non-streaming": 2_100.0, "streaming": 1_000.0}),
        run(2, "on", {"non-streaming": on_rps + 40, "streaming": 920.0}),
    ]
    configs = {name: ob.titan_config(name, 8000, "http://127.0.0.1:9000", "http://sink/v1/traces")
               for name in ob.CONFIGS}  # fmt: skip
    results = {
        "meta": {"started_at": "now", "command": "python -m benchmarks observability --quick",
                 "settings": asdict(settings), "machine": machine, "versions": versions,
                 "load_generator": "python"},
        "runs": runs, "configs": configs,
        "service_commands": {"upstream": "titan simulate", "otlp_sink": "python -m sink",
                             "titan (off)": "titan serve --config WORKSPACE/off.yaml"},
        "profile": {}, "wrk_scripts": {}, "upstream_stats": {},
    }  # fmt: skip
    results["cells"] = ob.summarize(runs)
    results["targets"] = orp.targets(results)
    return results


def test_settings_and_quick():
    full, quick = ob.ObservabilitySettings(), ob.ObservabilitySettings.quick()
    assert (full.rounds, full.concurrency, full.duration_s, full.scrape_interval_s) == (
        2,
        32,
        10,
        1,
    )
    assert (quick.rounds, quick.concurrency, quick.duration_s) == (1, 8, 1.0)
    assert quick.is_quick and not full.is_quick
    assert ob.ObservabilitySettings.quick(rounds=3).rounds == 3


def test_configs_differ_in_observability_only_and_validate():
    off = ob.titan_config("off", 8123, "http://127.0.0.1:9000", "http://127.0.0.1:4318/v1/traces")
    on = ob.titan_config("on", 8123, "http://127.0.0.1:9000", "http://127.0.0.1:4318/v1/traces")
    assert off["observability"] == {"request_metrics": False, "log_requests": False,
                                    "tracing": {"enabled": False}}  # fmt: skip
    assert on["observability"]["tracing"] == {
        "enabled": True,
        "otlp_endpoint": "http://127.0.0.1:4318/v1/traces",
        "sample_ratio": 1.0,
    }
    assert on["observability"]["request_metrics"] and on["observability"]["log_requests"]
    assert (off["server"]["log_level"], on["server"]["log_level"]) == ("warning", "info")
    same = {key for key in off if key not in ("observability", "server")}
    assert all(off[key] == on[key] for key in same) and off["storage"] == "memory://"
    assert off["server"]["port"] == on["server"]["port"] == 8123
    for mapping in (off, on):
        config = config_from_mapping(mapping, "test", environ={})
        assert config.server.port == 8123 and config.storage == "memory://"
    assert config.observability.tracing.enabled and config.observability.tracing.sample_ratio == 1


def test_metrics_and_log_counting(tmp_path: Path):
    page = (
        '# HELP titan_requests_total x\ntitan_requests_total{model="sim",status="200"} 12.0\n'
        'titan_requests_total{model="sim",status="503"} 3.0\ntitan_requests_created 1.0\n'
    )
    assert ob.requests_counted(page) == 15
    log = tmp_path / "titan.log"
    log.write_text(
        '{"logger":"titan.requests","msg":"request"}\n'
        '{"logger":"uvicorn.access","msg":"POST"}\n{"logger":"titan","msg":"up"}\n'
    )
    counts = ob.log_counts(log)
    assert (counts["lines"], counts["request_lines"], counts["access_lines"]) == (3, 1, 1)
    assert ob.log_counts(tmp_path / "missing.log")["lines"] == 0
    assert ob._delta({"batches": 5, "spans": None}, {"batches": 2, "spans": 1}) == {
        "batches": 3,
        "spans": None,
    }


def test_cpu_time():
    import os

    assert ob.cpu_seconds(os.getpid()) > 0
    assert ob.cpu_seconds(2**30) is None  # no such process


def test_sink_counts_batches_and_answers_200():
    import threading

    from titan.observability.spans import Span, SpanKind
    from titan.observability.tracing_export import encode_request

    counts = otlp_sink.Counts()
    server = otlp_sink.make_server(0, counts)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    span = Span("titan.request", 1, 2, 0, SpanKind.SERVER, 10, {}, end_ns=20)
    bodies = [encode_request([span] * 3, {}), encode_request([span] * 2, {}), b"not json"]
    try:
        for body in bodies:
            request = urllib.request.Request(
                f"{base}/v1/traces",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.status == 200
        with urllib.request.urlopen(f"{base}/stats", timeout=5) as response:
            stats = orjson.loads(response.read())
    finally:
        server.shutdown()
        server.server_close()
    assert stats.pop("cpu_s") >= 0
    assert stats == {"batches": 3, "bytes": sum(map(len, bodies)), "spans": 5, "unparsed": 1,
                     "other_requests": 0}  # fmt: skip


def test_summary_and_targets():
    results = fake_results()
    plain = results["cells"]["non-streaming"]
    assert plain["off"]["rps"] == pytest.approx(2_050.0) and plain["on"]["rps_rounds"] == [
        1_960.0, 2_000.0]  # fmt: skip
    assert plain["ratio"] == pytest.approx(1_980 / 2_050)
    assert plain["on"]["cpu_ms"] == pytest.approx(500 / 1_980, rel=1e-2)
    checks = {t["name"]: t for t in results["targets"]}
    cost = checks["throughput cost, non-streaming: 1 − on/off"]
    assert cost["passed"] is True and cost["value"] == pytest.approx(100 * (1 - 1_980 / 2_050))
    streaming = checks["throughput cost, streaming: 1 − on/off"]
    assert streaming["passed"] is False and streaming["value"] == pytest.approx(9.0)
    assert checks["failed requests (every run)"]["passed"] is True
    assert checks["span batches received by the sink (each on run, fewest)"]["value"] == 40
    assert checks["request log lines written (each on run, fewest)"]["passed"] is True

    worse = {t["name"]: t for t in fake_results(on_rps=1_500.0, errors=3)["targets"]}
    assert worse["throughput cost, non-streaming: 1 − on/off"]["passed"] is False
    assert worse["failed requests (every run)"]["value"] == 6
    results["runs"][1]["sink"]["batches"] = 0
    assert not {t["name"]: t for t in orp.targets(results)}[
        "span batches received by the sink (each on run, fewest)"]["passed"]  # fmt: skip


def test_markdown_section(tmp_path: Path):
    markdown = orp.render_markdown(fake_results(), json_name="bench/out/observability-x.json")
    start, end = results_file.markers("observability")
    assert markdown.startswith(start) and markdown.rstrip().endswith(end)
    for needle in ("Quick variant", "python -m benchmarks observability --quick", "### Targets",
                   "PASS",
                   "FAIL", "≤ 5%", "### Non-streaming, concurrency 8", "### Streaming, "
                   "concurrency 8", "| off | **2,050** | 2,000, 2,100 |", "on ÷ off", "0.966×",
                   "Titan CPU ms", "### What the on runs produced",
                   "| 1 | 40 | 24,000 | 6.0 | 2,000 | 0.50 | 4,000 |",
                   "4 (0 failed)", "orjson 3.10", "prometheus-client 0.26",
                   "titan 0.1", "request_metrics: false", "otlp_endpoint: http://sink/v1/traces",
                   "log_level: info", "sample_ratio: 1.0", "observability-x.json",
                   "titan serve --config WORKSPACE/off.yaml", "pure-Python client"):  # fmt: skip
        assert needle in markdown, needle
    assert "Quick variant" not in orp.render_markdown(fake_results(quick=False))
    path = tmp_path / "RESULTS.md"
    path.write_text(OTHER)
    results_file.write_section(path, markdown, "observability")
    once = path.read_text()
    results_file.write_section(path, markdown, "observability")
    assert path.read_text() == once and once.count(start) == 1
    assert "kept as it is" in once and once.index(OTHER_END) < once.index(start)


def test_console_tables():
    from rich.console import Console

    from titan.cli.tables import print_tables

    console = Console(record=True, width=220)
    print_tables(orp.report_tables(fake_results()), console)
    text = console.export_text()
    assert "Targets" in text and "Non-streaming" in text and "on runs" in text and "**" not in text


def test_cli_registers_the_command():
    result = CliRunner().invoke(build_app(), ["observability", "--help"])
    assert result.exit_code == 0
    assert "--quick" in result.output and "--python-load" in result.output


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_quick_run_through_the_cli(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(OTHER)
    result = CliRunner().invoke(
        build_app(), ["observability", "--quick", "--python-load", "--output", str(output)]
    )
    assert result.exit_code == 0, result.output
    text = output.read_text()
    start, end = results_file.markers("observability")
    assert text.count(start) == 1 and text.count(end) == 1 and "kept as it is" in text
    assert "Quick variant" in text and "### What the on runs produced" in text

    (json_path,) = (tmp_path / "out").glob("observability-*.json")
    results = orjson.loads(json_path.read_bytes())
    assert [(r["round"], r["config"]) for r in results["runs"]] == [(1, "off"), (1, "on")]
    off, on = results["runs"]
    for measured in (off, on):
        assert set(measured["cells"]) == set(ob.MODES)
        assert all(c["num_ok"] > 0 and c["num_errors"] == 0 for c in measured["cells"].values())
    # Tracing, request logs and metrics were really on, and only there.
    assert on["sink"]["batches"] > 0 and on["sink"]["spans"] > 0 and off["sink"]["batches"] == 0
    assert on["log"]["request_lines"] == on["metrics_requests"] > 0
    assert off["log"]["request_lines"] == 0
    assert on["scrapes"]["scrapes"] >= 1 and on["scrapes"]["failures"] == 0
    assert all(results["cells"][mode]["ratio"] > 0 for mode in ob.MODES)
    assert all(results["cells"][mode][c]["cpu_ms"] > 0 for mode in ob.MODES for c in ob.CONFIGS)
