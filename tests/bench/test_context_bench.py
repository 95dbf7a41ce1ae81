"""``titan bench context``: structure only (no timing assertions); the real run is slow."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from titan.bench import context_bench as cb
from titan.cli.bench import bench_app


def record(status: int, tokens: int | None = None) -> dict:
    return {"status": status, "code": None if status == 200 else "context_length_exceeded",
            "wall_s": 0.5, "prompt_tokens": tokens}  # fmt: skip


def fake_results(quick: bool = True) -> dict:
    trimmed = [record(200, 100 + 20 * min(i, 20)) for i in range(30)]
    naive = [record(200, 100 + 20 * i) if i < 10 else record(400) for i in range(30)]
    conversation = {"model": "m", "window": 512, "command": "titan serve", "config": {"a": 1},
                    "user_turns": [], "trimmed": trimmed, "naive": naive}  # fmt: skip
    conversation["summary"] = {m: cb.summarize(conversation[m]) for m in ("trimmed", "naive")}
    retrieval = {"chunks": 1000, "real_chunks": 18, "filler_chunks": 982, "index": "exact",
                 "real_embed_s": 0.1, "rebuild_s": 0.1, "queries": 20, "p50_ms": 1.0,
                 "p99_ms": 2.0, "mean_ms": 1.2, "top_hit_right_file": 1.0}  # fmt: skip
    machine = {"cpu_model": "cpu", "num_cores": 2, "platform": "linux",
               "load_average_before": 0.1, "load_average_after": 0.2}  # fmt: skip
    versions = {"python": "3", "titan": "0", "torch": "2", "transformers": "5"}
    settings = cb.ContextBenchSettings.quick() if quick else cb.ContextBenchSettings()
    results = {"meta": {"started_at": "now", "command": "titan bench context",
                        "settings": cb.asdict(settings), "machine": machine,
                        "versions": versions},
               "conversation": conversation, "retrieval": retrieval}  # fmt: skip
    results["targets"] = cb.targets(results)
    return results


def test_user_turns_are_seeded_and_varied():
    turns = cb.user_turns(100, seed=0)
    assert turns == cb.user_turns(100, seed=0) and len(set(turns)) == 100
    assert all(15 <= len(t.split()) <= 60 for t in turns)


def test_settings_and_config():
    full, quick = cb.ContextBenchSettings(), cb.ContextBenchSettings.quick()
    assert (full.turns, full.window, full.max_output_tokens, full.chunks, full.queries) == (
        100, 1024, 16, 10_000, 200)  # fmt: skip
    assert quick.is_quick and quick.turns < full.turns and quick.chunks < full.chunks
    config = cb.titan_config(8000, 1024)
    assert config["models"][0]["deployments"][0]["engine"] == {"max_model_len": 1024}
    assert config["storage"] == "memory://" and config["cache"]["exact"] is False


def test_summary_deciles_and_targets():
    results = fake_results()
    naive = results["conversation"]["summary"]["naive"]
    assert len(naive["deciles"]) == 10 and naive["deciles"][0]["turns"] == "1–3"
    assert naive["served"] == pytest.approx(1 / 3) and naive["last_served_turn"] == 10
    assert naive["failures"] == {"context_length_exceeded": 20}
    assert naive["deciles"][-1]["prompt_tokens_p50"] is None
    checks = {t["name"]: t["passed"] for t in results["targets"]}
    assert checks["trimmed: turns served"] and checks["trimmed: max prompt tokens"]
    assert checks["naive: turns served (reported)"] is None


def test_markdown_section(tmp_path):
    markdown = cb.render_markdown(fake_results(), json_name="bench/out/context-x.json")
    start, end = cb.results_file.markers("context")
    assert markdown.startswith(start) and markdown.rstrip().endswith(end)
    for needle in ("Quick variant", "titan bench context", "| 1–3 |", "PASS", "Retrieval",
                   "rebuild()", "context-x.json", "max_model_len"):  # fmt: skip
        assert needle in markdown
    path = tmp_path / "RESULTS.md"
    path.write_text(
        "# Benchmark results\n\n<!-- cache-bench:start -->\nC\n<!-- cache-bench:end -->\n"
    )
    cb.results_file.write_section(path, markdown, "context")
    cb.results_file.write_section(path, markdown, "context")
    text = path.read_text()
    assert text.count(start) == 1 and "<!-- cache-bench:start -->" in text


def test_cli_registers_the_command():
    result = CliRunner().invoke(bench_app, ["context", "--help"])
    assert result.exit_code == 0 and "--quick" in result.output


@pytest.mark.slow
def test_quick_run_writes_the_section(tmp_path):
    settings = cb.ContextBenchSettings.quick(turns=6, window=512, chunks=300, queries=5)
    outcome = cb.bench_context(settings, output=tmp_path / "RESULTS.md", command="test")
    assert outcome.markdown_path.exists() and outcome.json_path.exists()
    assert len(outcome.results["conversation"]["trimmed"]) == 6
    assert outcome.results["retrieval"]["queries"] == 5
