"""``python -m benchmarks planner``: its pieces and the report on fake results; then (slow) the
quick variant end to end through the CLI. No accuracy thresholds here: the 25% target belongs to the
report, not to tests."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from typer.testing import CliRunner

from benchmarks import planner_report, results_file
from benchmarks.cli import build_app
from benchmarks.planner_bench import PlannerBenchSettings, _slow_step_share
from benchmarks.planner_runs import StepRecorder, shared_prefix_tokens
from titan.planning.calibration import StepSample
from titan.planning.step_cost import LinearStepCost

OTHER_START, OTHER_END = results_file.markers("engine")
OTHER = f"# Benchmark results\n\n{OTHER_START}\n## Engine\n\nkept as it is\n{OTHER_END}\n"


def comparison(rate: float, predicted_p99: float, measured_p99: float) -> dict:
    def ttft(p50: float, p99: float) -> dict:
        return {"p50_s": p50, "p90_s": p99 * 0.8, "p99_s": p99}

    error = (predicted_p99 - measured_p99) / measured_p99
    return {
        "rate": rate,
        "num_requests": 40,
        "num_prompt_tokens": 9000,
        "num_output_tokens": 2000,
        "predicted": {
            "ttft": ttft(0.5, predicted_p99),
            "tpot": {"p50_s": 0.06, "p99_s": 0.1},
            "num_steps": 500,
            "num_preemptions": 0,
        },
        "measured": {
            "ttft": ttft(0.5, measured_p99),
            "tpot": {"p50_s": 0.06, "p99_s": 0.1},
            "num_steps": 510,
            "wall_s": 80.0,
            "max_late_s": 0.1,
            "slow_step_share": 0.01,
            "step_time_vs_model": 1.02,
            "other_cpu_cores": 0.3,
        },
        "ttft_relative_error": {"p50": 0.0, "p90": error, "p99": error},
        "median_chunk_while_decoding": {"predicted": 43.0, "measured": 42.0},
        "requests": [[0.5, 100, 20, 0.4, 0.41]],
        "steady_state": {
            "ttft": ttft(0.6, 1.5),
            "tpot": {"p50_s": 0.06, "p99_s": 0.1},
            "mean_seqs_per_step": 2.5,
            "is_saturated": False,
        },
    }


def fake_results(quick: bool = False) -> dict:
    settings = PlannerBenchSettings.quick() if quick else PlannerBenchSettings()
    cost = LinearStepCost(0.05, 0.0012, 1e-6, 4e-4).to_dict()
    results = {
        "meta": {
            "benchmark": "planner",
            "started_at": "2026-11-29T23:00:00+00:00",
            "command": "python -m benchmarks planner",
            "settings": settings.__dict__,
            "engine": {
                "model": "SmolLM2-135M-Instruct",
                "dtype": "bfloat16",
                "num_threads": 1,
                "max_num_seqs": 32,
                "max_num_batched_tokens": 512,
                "max_decode_slowdown": 2.0,
                "num_kv_blocks": 1456,
                "block_size": 16,
            },
            "machine": {
                "cpu_model": "AMD EPYC",
                "platform": "Linux",
                "num_cores": 2,
                "load_average_before": 0.5,
                "load_average_after": 1.0,
            },
            "versions": {"python": "3.11.7", "torch": "2.13.0", "titan": "0.1.0"},
        },
        "calibration": {
            "cost": cost,
            "engine_model": cost,
            "num_samples": 1400,
            "num_grid_samples": 129,
            "median_relative_error": 0.036,
            "p90_relative_error": 0.13,
            "runs": [comparison(0.3, 0.9, 1.0)],
        },
        "validation": [
            comparison(0.5, 1.2, 1.1),
            comparison(1.1, 1.8, 1.8),
            comparison(1.6, 3.0, 2.2),
        ],
    }
    results["targets"] = planner_report.targets(results)
    return results


def test_targets_are_within_25_percent_at_p50_and_p99():
    targets = fake_results()["targets"]
    assert len(targets) == 6
    assert [t["passed"] for t in targets] == [True, True, True, True, True, False]
    assert targets[-1]["value"] == pytest.approx(100 * 0.8 / 2.2)


@pytest.mark.parametrize("quick", [False, True])
def test_markdown_section(tmp_path: Path, quick: bool):
    results = fake_results(quick)
    markdown = planner_report.render_markdown(results, "bench/out/planner-x.json")
    assert markdown.startswith(planner_report.SECTION_START)
    assert markdown.rstrip().endswith(planner_report.SECTION_END)
    assert ("Quick variant" in markdown) is quick
    for text in (
        "### Targets",
        "| 1.6 | 40 | 500 | 500 | +0.0% | 3,000 | 2,200 | +36.4% |",
        "FAIL",
        "Fitted step cost: 50.00 ms",
        "Raw numbers: `bench/out/planner-x.json`",
    ):
        assert text in markdown
    path = tmp_path / "RESULTS.md"
    path.write_text(OTHER)
    results_file.write_section(path, markdown, "planner")
    text = path.read_text()
    assert "kept as it is" in text and text.count(planner_report.SECTION_START) == 1


def test_shared_prefix_and_slow_steps():
    assert shared_prefix_tokens([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7]]) == 2
    assert shared_prefix_tokens([[5, 6], [5, 6, 7]]) == 2
    cost = LinearStepCost(0.05, 0.001)
    steps = [StepSample(10, 1, 10, 10, 0.06), StepSample(10, 1, 10, 10, 0.2)]
    assert _slow_step_share(steps, cost) == 0.5
    assert _slow_step_share([], cost) == 0.0


def test_step_recorder_describes_what_was_scheduled():
    scheduled = [
        SimpleNamespace(start=0, num_new_tokens=10),
        SimpleNamespace(start=20, num_new_tokens=1),
    ]
    output = SimpleNamespace(scheduled=scheduled)
    engine = SimpleNamespace(scheduler=SimpleNamespace(schedule=lambda: output))
    recorder = StepRecorder(engine)  # type: ignore[arg-type]
    assert recorder.sample(0.1) is None  # nothing scheduled yet
    assert engine.scheduler.schedule() is output
    sample = recorder.sample(0.25)
    assert sample == StepSample(11, 2, 55 + 21, 10 + 21, 0.25)


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(OTHER)
    result = CliRunner().invoke(
        build_app(), ["planner", "--quick", "--output", str(output)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    text = output.read_text()
    assert "kept as it is" in text and "Planner benchmark" in text and "Quick variant" in text
    (json_path,) = (tmp_path / "out").glob("planner-*.json")
    results = orjson.loads(json_path.read_bytes())
    assert len(results["validation"]) == 3 and len(results["targets"]) == 6
    for row in results["validation"]:
        assert row["num_requests"] == len(row["requests"])
        assert all(r[4] > 0 for r in row["requests"])  # every request got its first token
