"""The gateway benchmark: its pieces (wrk's output, summaries, overheads, targets, the report's
section) and, end to end, its quick variant without wrk and without LiteLLM, which every machine
can run. No timing thresholds: speed targets belong to the benchmark report, not to tests."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from benchmarks import gateway_load as load
from benchmarks.base import measure
from benchmarks.cli import build_app
from benchmarks.engine_report import SECTION_END as ENGINE_END
from benchmarks.engine_report import SECTION_START as ENGINE_START
from benchmarks.gateway_bench import GatewaySettings, targets
from benchmarks.gateway_report import BENCHMARK, NAME, SECTION_END, SECTION_START
from benchmarks.results_file import write_section
from titan.loadgen.wire import Endpoint

ENGINE_SECTION = (
    f"# Benchmark results\n\n{ENGINE_START}\n## Engine\n\nkept as it is\n{ENGINE_END}\n"
)
WRK_STDOUT = (
    "Running 2s test @ http://127.0.0.1:1/v1/chat/completions\n"
    "  1 threads and 4 connections\n"
    "WRK_RESULT 400 2000000 0 1 0 3 0 21000 22000 25000 26000 27000\n"
)


def test_wrk_output_is_parsed_from_the_scripts_line():
    summary = load.parse_wrk_output(WRK_STDOUT)
    assert summary is not None
    assert summary["num_requests"] == 401  # 400 answers + 1 read error
    assert summary["num_ok"] == 397 and summary["num_errors"] == 4
    assert summary["errors"] == {"read": 1, "status": 3}
    assert summary["rps"] == pytest.approx(397 / 2.0)
    assert summary["p50_ms"] == 21.0 and summary["p99_ms"] == 25.0 and summary["max_ms"] == 27.0
    assert load.parse_wrk_output("no result line") is None


def test_wrk_script_posts_the_body_and_reports_in_done():
    body = load.chat_body("sim", is_stream=True)
    script = load.wrk_script(body, "KEY")
    assert f"wrk.body = [[{body.decode()}]]" in script
    assert 'wrk.headers["Authorization"] = "Bearer KEY"' in script
    assert "done = function(summary, latency, requests)" in script
    assert orjson.loads(body)["stream"] is True
    with pytest.raises(ValueError):
        load.wrk_script(b'{"content": "]]"}', "KEY")
    argv = load.wrk_argv("wrk", Path("s.lua"), Endpoint.of("http://127.0.0.1:9"), 64, 0.4, 30)
    assert argv == ["wrk", "-t1", "-c64", "-d1s", "--timeout=30s", "-s", "s.lua", argv[-1]]
    assert argv[-1] == "http://127.0.0.1:9/v1/chat/completions"


def test_summary_counts_errors_apart_from_latencies():
    records = [(0.0, 0.02, 200, 1), (0.1, 0.04, 200, 2), (0.2, 1.0, 503, 1), (0.3, 0.5, 0, 0)]
    summary = load.summarize(records, wall_s=2.0)
    assert summary["num_requests"] == 4 and summary["num_ok"] == 2
    assert summary["errors"] == {"503": 1, "transport": 1}
    assert summary["rps"] == 1.0 and summary["num_retried"] == 1
    assert summary["p50_ms"] == pytest.approx(30.0) and summary["max_ms"] == pytest.approx(40.0)
    assert load.summarize([], wall_s=1.0)["p99_ms"] is None


def _cell(mode: str, system: str, rps: float, added_p99: float | None) -> dict:
    return {"mode": mode, "concurrency": 64, "system": system, "rps": rps,
            "added_p99_ms": added_p99}  # fmt: skip


def test_targets_compare_titan_with_litellm_and_with_its_no_fault_run():
    cells = []
    for mode in ("non-streaming", "streaming"):
        cells += [_cell(mode, "direct", 1000, None), _cell(mode, "titan", 900, 1.0)]
        cells += [_cell(mode, "litellm", 200, 10.0)]
    runs = {"titan_no_fault": {"p99_ms": 30.0}, "titan": {"p99_ms": 50.0, "num_errors": 0}}
    checks = targets({"overhead": {"cells": cells}, "transients": {"runs": runs}})
    assert [c["passed"] for c in checks] == [True, True, True, True, False, True]
    assert checks[0]["value"] == pytest.approx(4.5) and checks[1]["value"] == pytest.approx(0.1)
    assert checks[4]["value"] == pytest.approx(50 / 30)

    without_litellm = [c for c in cells if c["system"] != "litellm"]
    checks = targets({"overhead": {"cells": without_litellm}, "transients": {"runs": runs}})
    assert [c["name"] for c in checks] == [
        "transients: Titan p99 / no-fault p99",
        "transients: client errors through Titan",
    ]


def test_section_goes_between_its_markers_and_keeps_the_engine_section(tmp_path: Path):
    path = tmp_path / "RESULTS.md"
    path.write_text(ENGINE_SECTION)
    write_section(path, f"{SECTION_START}\nfirst\n{SECTION_END}\n", NAME)
    write_section(path, f"{SECTION_START}\nsecond\n{SECTION_END}\n", NAME)
    text = path.read_text()
    assert text.startswith(ENGINE_SECTION.rstrip("\n"))
    assert "second" in text and "first" not in text
    assert text.count(SECTION_START) == text.count(SECTION_END) == 1


def test_a_missing_wrk_fails_with_an_install_hint(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    arguments = ["gateway", "--quick", "--wrk", "no-such-wrk", "--output", str(output)]
    result = CliRunner().invoke(build_app(), arguments)
    assert result.exit_code == 2
    assert "apt-get install wrk" in result.output and "--python-load" in result.output
    assert not output.exists()


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_quick_benchmark_measures_titan_without_wrk_or_litellm(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(ENGINE_SECTION)
    settings = GatewaySettings.quick(wrk=None, litellm=None)

    outcome = measure(BENCHMARK, settings, output, command="pytest quick gateway bench")

    text = output.read_text()
    assert text.startswith(ENGINE_SECTION.rstrip("\n"))
    assert text.count(SECTION_START) == 1 and text.count(SECTION_END) == 1
    assert text.index(SECTION_START) < text.index(SECTION_END)
    for heading in ("### Targets", "### Overhead", "### Transients", "### Commands and configs"):
        assert heading in text
    assert "Quick variant" in text and "LiteLLM was not found" in text
    assert "PASS" in text or "MISS" in text

    results = orjson.loads(outcome.json_path.read_bytes())
    assert outcome.json_path.parent == tmp_path / "out"
    assert set(results) == {"meta", "overhead", "transients", "targets"}
    assert results["meta"]["command"] == "pytest quick gateway bench"
    assert results["meta"]["load_generator"] == "python"
    assert results["meta"]["versions"]["litellm"] is None

    cells = results["overhead"]["cells"]
    assert {(c["mode"], c["concurrency"], c["system"]) for c in cells} == {
        (mode, c, system)
        for mode in ("non-streaming", "streaming")
        for c in (1, 4)
        for system in ("direct", "titan")
    }
    for cell in cells:
        assert cell["num_errors"] == 0
        assert cell["rps"] > 0 and 0 < cell["p50_ms"] <= cell["p99_ms"]
        if cell["system"] == "titan":
            assert cell["peak_rss_mib"] > 0 and cell["added_p99_ms"] is not None

    runs = results["transients"]["runs"]
    assert set(runs) == {"direct", "titan_no_fault", "titan"}
    for name in ("titan_no_fault", "titan"):
        run = runs[name]
        assert run["rps"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"] <= run["p999_ms"]
        assert run["proxy_stats"]["models"]["sim"]["requests"] >= run["num_requests"]
    assert runs["titan"]["upstream_stats"]["second"]["requests"] > 0
    assert runs["direct"]["num_errors"] > 0  # the outage, seen straight
    assert len(results["targets"]) == 2
    assert {t["passed"] for t in results["targets"]} <= {True, False}
