"""``python -m benchmarks jobs``: its pieces and the report's structure on fake results; then (slow)
the quick variant end to end through the CLI. No timing thresholds: speed targets belong to the
report, not to tests."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from benchmarks import jobs_bench as jb
from benchmarks import jobs_report as jr
from benchmarks import results_file
from benchmarks.cli import build_app
from tests.redis_server import redis_server  # noqa: F401

OTHER_START, OTHER_END = results_file.markers("cache")
OTHER = f"# Benchmark results\n\n{OTHER_START}\n## Cache\n\nkept as it is\n{OTHER_END}\n"


def mode_row(mode: str, jobs_per_s: float, retried: int = 0) -> dict:
    queue = {"jobs": 300, "seconds": 300 / jobs_per_s, "submit_s": 0.2, "succeeded": 300,
             "jobs_per_s": jobs_per_s, "counts": {"succeeded": 320}, "warmup_jobs": 20,
             "all_finished": True, "settlements": 300 + retried,
             "retried_jobs": retried}  # fmt: skip
    direct = {"requests": 300, "seconds": 0.05, "errors": {}, "requests_per_s": 6000.0}
    server = "7.0" if mode == "redis" else None
    return {"mode": mode, "storage": f"{mode}://x", "queue": queue, "direct": direct,
            "ratio": jobs_per_s / 6000.0, "redis_server": server}  # fmt: skip


def phase(p50: float, p99: float) -> dict:
    return {"requests": 800, "seconds": 5.0, "statuses": {"200": 800}, "requests_per_s": 160.0,
            "p50_ms": p50, "p99_ms": p99, "mean_ms": p50 + 1}  # fmt: skip


def state(t_s: float, completed: int, status: str = "in_progress") -> dict:
    return {"t_s": t_s, "status": status, "total": 500, "completed": completed, "failed": 0}


def fake_results(quick: bool = True, p99_with_batch: float = 33.0, early: bool = False) -> dict:
    settings = jb.JobsBenchSettings.quick() if quick else jb.JobsBenchSettings()
    timeline = [state(0.1, 10), state(1.1, 200), state(5.1, 400)]
    if early:
        timeline = [state(0.1, 10), state(1.1, 500, "completed"), state(5.1, 500, "completed")]
    batch = {"id": "batch_x", **jb.summarize_batch(timeline, jobs=500, create_s=0.05)}
    machine = {"cpu_model": "cpu", "num_cores": 2, "platform": "linux",
               "load_average_before": 0.1, "load_average_after": 0.2}  # fmt: skip
    versions = {"python": "3", "titan": "0", "sqlite": "3.45", "redis-py": "8", "httpx": "0.28",
                "redis_server": "7.0", "uvicorn": "0.30"}  # fmt: skip
    results = {
        "meta": {"started_at": "now", "command": "python -m benchmarks jobs --quick",
                 "settings": asdict(settings), "machine": machine, "versions": versions},
        "throughput": {"config": jb.pipeline_config("<per mode>", 32, 0.05),
                       "modes": [mode_row("sqlite", 1200.0), mode_row("redis", 850.0)],
                       "sqlite_library": "3.45"},
        "interactive": {"alone": phase(23.0, 30.0), "with_batch": phase(24.0, p99_with_batch),
                        "batch": batch, "command": "TITAN_STORAGE=x titan serve",
                        "config": jb.serve_config(8000, "sqlite:///WORKSPACE/titan.db",
                                                  settings)},
    }  # fmt: skip
    results["targets"] = jr.targets(results)
    return results


def test_settings_and_quick():
    full, quick = jb.JobsBenchSettings(), jb.JobsBenchSettings.quick()
    assert (full.jobs, full.workers, full.poll_s, full.batch_jobs, full.duration_s) == (
        5_000, 32, 0.05, 10_000, 15.0)  # fmt: skip
    assert (full.clients, full.serve_workers, full.ttft_s, full.output_tokens) == (4, 16, 0.02, 8)
    assert (quick.jobs, quick.batch_jobs, quick.duration_s) == (300, 500, 5.0)
    assert quick.is_quick and not full.is_quick
    assert full.modes == ("sqlite", "redis")
    assert jb.JobsBenchSettings.quick(redis_url=None).modes == ("sqlite",)
    assert jb.JobsBenchSettings.quick(jobs=7).jobs == 7


def test_configs():
    config = jb.pipeline_config("sqlite:////tmp/x.db", 32, 0.05)
    assert config["storage"] == "sqlite:////tmp/x.db"
    assert config["jobs"] == {"workers": 32, "poll_s": 0.05}
    assert config["cache"]["exact"] is False and config["probes"] == {"enabled": False}
    assert config["hedge"] == {"enabled": False}
    (deployment,) = config["models"][0]["deployments"]
    assert config["models"][0]["name"] == jb.MODEL
    assert deployment == {"backend": "simulated", "profile": {"ttft_s": 0.0, "output_tokens": 4}}
    served = jb.serve_config(8123, "sqlite:////w/titan.db", jb.JobsBenchSettings())
    assert served["server"]["port"] == 8123 and served["jobs"] == {"workers": 16}
    assert served["models"][0]["deployments"][0]["profile"] == {"ttft_s": 0.02,
                                                                 "output_tokens": 8}  # fmt: skip
    assert served["cache"]["exact"] is False and served["storage"] == "sqlite:////w/titan.db"


def test_batch_lines_are_distinct_chat_requests():
    lines = jb.batch_lines(50, 8).decode().splitlines()
    requests = [orjson.loads(line) for line in lines]
    assert len(requests) == 50 and len({r["custom_id"] for r in requests}) == 50
    assert {r["url"] for r in requests} == {"/v1/chat/completions"}
    assert {r["body"]["max_tokens"] for r in requests} == {8}
    assert len({r["body"]["messages"][0]["content"] for r in requests}) == 50


def test_closed_loop_records_latency_and_statuses():
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(orjson.loads(request.content))
        return httpx.Response(200 if len(calls) % 10 else 503, json={})

    async def run() -> dict:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            settings = jb.JobsBenchSettings.quick(duration_s=0.05, clients=3)
            return await jb.closed_loop(client, settings, "test")

    measured = asyncio.run(run())
    assert measured["requests"] == measured["statuses"]["200"] > 0
    assert sum(measured["statuses"].values()) == len(calls)
    assert len({c["messages"][0]["content"] for c in calls}) == len(calls)
    assert 0 < measured["p50_ms"] <= measured["p99_ms"]
    assert jb.latency_stats([]) == {"p50_ms": None, "p99_ms": None, "mean_ms": None}


def test_batch_summary():
    running = fake_results()["interactive"]["batch"]
    assert running["done_in_window"] == 390 and running["window_s"] == pytest.approx(5.0)
    assert running["jobs_per_s"] == pytest.approx(78.0) and running["still_running_at_end"]
    assert running["finished_after_s"] is None
    early = fake_results(early=True)["interactive"]["batch"]
    assert not early["still_running_at_end"] and early["finished_after_s"] == pytest.approx(1.0)
    assert early["jobs_per_s"] == pytest.approx(490.0)  # over the second it ran


def test_targets():
    checks = {t["name"]: t for t in fake_results()["targets"]}
    assert checks["SQLite: jobs/s, submit to result"]["passed"] is True
    assert checks["Redis: jobs/s, submit to result (reported)"]["passed"] is None
    assert checks["jobs not succeeded, or retried (every mode)"]["passed"] is True
    p99 = checks["interactive p99 with the batch running ÷ without"]
    assert p99["passed"] is True and p99["value"] == pytest.approx(1.1)
    p50 = checks["interactive p50 with the batch running ÷ without (reported)"]
    assert p50["passed"] is None and p50["value"] == pytest.approx(24 / 23)

    worse = {t["name"]: t["passed"] for t in fake_results(p99_with_batch=40.0)["targets"]}
    assert worse["interactive p99 with the batch running ÷ without"] is False
    results = fake_results()
    results["throughput"]["modes"] = [mode_row("sqlite", 400.0, retried=2)]
    slow = {t["name"]: t["passed"] for t in jr.targets(results)}
    assert slow["SQLite: jobs/s, submit to result"] is False
    assert slow["jobs not succeeded, or retried (every mode)"] is False
    assert not any(name.startswith("Redis") for name in slow)


def test_markdown_section(tmp_path):
    markdown = jr.render_markdown(fake_results(), json_name="bench/out/jobs-x.json")
    start, end = results_file.markers("jobs")
    assert markdown.startswith(start) and markdown.rstrip().endswith(end)
    for needle in ("Quick variant", "python -m benchmarks jobs --quick", "### Targets", "PASS",
                   "info",
                   "| SQLite | 300 / 300 |", "**1,200**", "| Redis |", "0.20×", "6,000",
                   "A: interactive alone", "B: with the batch running", "**33.0**", "1.10×",
                   "390 (78/s)", "still running when the window closed", "jobs-x.json",
                   "TITAN_STORAGE=x titan serve", "workers: 16", "ttft_s: 0.02", "sqlite 3.45",
                   "redis_server 7.0", "retried jobs"):  # fmt: skip
        assert needle in markdown, needle
    assert "Quick variant" not in jr.render_markdown(fake_results(quick=False))
    early = jr.render_markdown(fake_results(early=True))
    assert "It finished after 1.0 s of the 5 s window" in early
    path = tmp_path / "RESULTS.md"
    path.write_text(OTHER)
    results_file.write_section(path, markdown, "jobs")
    once = path.read_text()
    results_file.write_section(path, markdown, "jobs")
    assert path.read_text() == once and once.count(start) == 1
    assert "kept as it is" in once and once.index(OTHER_END) < once.index(start)


def test_console_tables():
    from rich.console import Console

    from titan.cli.tables import print_tables

    console = Console(record=True, width=200)
    print_tables(jr.report_tables(fake_results()), console)
    text = console.export_text()
    assert "Throughput" in text and "Interactive latency" in text and "**" not in text


def test_cli_registers_the_command():
    result = CliRunner().invoke(build_app(), ["jobs", "--help"])
    assert result.exit_code == 0
    assert "--quick" in result.output and "--skip-redis" in result.output


@pytest.mark.bench_smoke
@pytest.mark.slow
@pytest.mark.redis
def test_quick_run_through_the_cli(tmp_path, redis_server):  # noqa: F811
    output = tmp_path / "RESULTS.md"
    output.write_text(OTHER)
    result = CliRunner().invoke(
        build_app(), ["jobs", "--quick", "--output", str(output), "--redis-url", redis_server]
    )
    assert result.exit_code == 0, result.output
    (json_path,) = (tmp_path / "out").glob("jobs-*.json")
    results = orjson.loads(json_path.read_bytes())
    modes = {row["mode"]: row for row in results["throughput"]["modes"]}
    assert set(modes) == {"sqlite", "redis"}
    for row in modes.values():
        queue = row["queue"]
        assert queue["succeeded"] == queue["jobs"] == 300 and queue["all_finished"]
        assert queue["jobs_per_s"] > 0 and queue["retried_jobs"] == 0
        assert row["direct"]["requests_per_s"] > 0 and row["direct"]["errors"] == {}
    assert modes["redis"]["storage"].startswith(redis_server + "/")
    inter = results["interactive"]
    for key in ("alone", "with_batch"):
        assert inter[key]["requests"] > 0 and set(inter[key]["statuses"]) == {"200"}
        assert 0 < inter[key]["p50_ms"] <= inter[key]["p99_ms"]
    assert inter["batch"]["done_in_window"] > 0 and inter["batch"]["end"]["failed"] == 0
    text = output.read_text()
    assert "kept as it is" in text and text.count(results_file.markers("jobs")[0]) == 1
    assert "Quick variant" in text and "jobs/s" in text
