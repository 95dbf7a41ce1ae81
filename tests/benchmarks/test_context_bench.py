"""``python -m benchmarks context``: structure only (no timing assertions); the real run is slow."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from benchmarks import context_bench as cb
from benchmarks import context_report as cr
from benchmarks import results_file
from benchmarks.base import measure
from benchmarks.cli import build_app


def record(status: int, tokens: int | None = None) -> dict:
    return {"status": status, "code": None if status == 200 else "context_length_exceeded",
            "wall_s": 0.5, "prompt_tokens": tokens}  # fmt: skip


def fake_results(quick: bool = True) -> dict:
    trimmed = [record(200, 100 + 20 * min(i, 20)) for i in range(30)]
    # Headroom: the prompt shrinks after each trim, and later turns run faster.
    headroom = [record(200, 100 + 20 * (i % 10)) for i in range(30)]
    for turn in headroom[15:]:
        turn["wall_s"] = 0.25
    naive = [record(200, 100 + 20 * i) if i < 10 else record(400) for i in range(30)]
    conversation = {"model": "m", "window": 512, "command": "titan serve", "config": {"a": 1},
                    "headroom_command": "titan serve (headroom)",
                    "headroom_config": {"a": 1, "context": {"trim_headroom": 0.5}},
                    "user_turns": [], "trimmed": trimmed, "naive": naive,
                    "headroom": headroom}  # fmt: skip
    conversation["summary"] = {m: cb.summarize(conversation[m]) for m in cb.MODES}
    search = {"queries": 20, "p50_ms": 1.0, "p99_ms": 2.0, "mean_ms": 1.2,
              "top_hit_right_file": 1.0}  # fmt: skip
    retrieval = {"chunks": 1000, "real_chunks": 18, "filler_chunks": 982, "index": "exact",
                 "real_embed_s": 0.1, "load_s": 0.1,
                 "rankers": {"auto": search, "none": {**search, "p50_ms": 0.8,
                                                      "top_hit_right_file": 0.75}}}  # fmt: skip
    machine = {"cpu_model": "cpu", "num_cores": 2, "platform": "linux",
               "load_average_before": 0.1, "load_average_after": 0.2}  # fmt: skip
    versions = {"python": "3", "titan": "0", "torch": "2", "transformers": "5"}
    settings = cb.ContextBenchSettings.quick() if quick else cb.ContextBenchSettings()
    results = {"meta": {"started_at": "now", "command": "python -m benchmarks context",
                        "settings": asdict(settings), "machine": machine,
                        "versions": versions},
               "conversation": conversation, "retrieval": retrieval}  # fmt: skip
    results["targets"] = cr.targets(results)
    return results


def test_user_turns_are_seeded_and_varied():
    turns = cb.user_turns(100, seed=0)
    assert turns == cb.user_turns(100, seed=0) and len(set(turns)) == 100
    assert all(15 <= len(t.split()) <= 60 for t in turns)


def test_settings_and_config():
    full, quick = cb.ContextBenchSettings(), cb.ContextBenchSettings.quick()
    assert (full.turns, full.window, full.max_output_tokens, full.chunks, full.queries) == (
        100, 1024, 16, 10_000, 200)  # fmt: skip
    assert 0 < full.trim_headroom < 1
    assert quick.is_quick and quick.turns < full.turns and quick.chunks < full.chunks
    config = cb.titan_config(8000, 1024)
    assert config["models"][0]["deployments"][0]["engine"] == {"max_model_len": 1024}
    assert config["storage"] == "memory://" and config["cache"]["exact"] is False
    headroom = cb.headroom_config(8001, 1024, 0.5)
    assert headroom == {**cb.titan_config(8001, 1024), "context": {"trim_headroom": 0.5}}


def test_search_queries_are_seeded_topic_sentences():
    settings = cb.ContextBenchSettings.quick()
    queries = cb.search_queries(settings)
    assert queries == cb.search_queries(settings)
    assert len(queries) == settings.warmup_queries + settings.queries
    for topic, query in queries:
        assert any(s.lower() in query for s in cb.TOPICS[topic])


def test_summary_deciles_and_targets():
    results = fake_results()
    naive = results["conversation"]["summary"]["naive"]
    assert len(naive["deciles"]) == 10 and naive["deciles"][0]["turns"] == "1–3"
    assert naive["served"] == pytest.approx(1 / 3) and naive["last_served_turn"] == 10
    assert naive["failures"] == {"context_length_exceeded": 20}
    assert naive["deciles"][-1]["prompt_tokens_p50"] is None
    headroom = results["conversation"]["summary"]["headroom"]
    assert headroom["served"] == 1.0 and headroom["max_prompt_tokens"] == 280
    assert headroom["second_half_wall_ms_p50"] == 250
    checks = {t["name"]: t for t in results["targets"]}
    for mode in ("trimmed", "headroom"):
        assert checks[f"{mode}: turns served"]["passed"]
        assert checks[f"{mode}: max prompt tokens"]["passed"]
    assert checks["naive: turns served (reported)"]["passed"] is None
    ratio = checks["time per turn p50, 2nd half: trimmed ÷ headroom (reported)"]
    assert ratio["passed"] is None and ratio["value"] == pytest.approx(2.0)


def test_a_prompt_over_the_window_fails_its_target():
    results = fake_results()
    results["conversation"]["headroom"][-1]["prompt_tokens"] = 600
    summary = results["conversation"]["summary"]
    summary["headroom"] = cb.summarize(results["conversation"]["headroom"])
    checks = {t["name"]: t["passed"] for t in cr.targets(results)}
    assert checks["headroom: max prompt tokens"] is False and checks["trimmed: max prompt tokens"]


def test_markdown_section(tmp_path):
    markdown = cr.render_markdown(fake_results(), json_name="bench/out/context-x.json")
    start, end = results_file.markers("context")
    assert markdown.startswith(start) and markdown.rstrip().endswith(end)
    for needle in ("Quick variant", "python -m benchmarks context", "| 1–3 |", "PASS", "Retrieval",
                   "Index load (first search after a restart): 0.10 s", "context-x.json",
                   "max_model_len", "trim_headroom: 0.5", "*headroom*", "headroom served",
                   "headroom time p50 (ms)", "2.00×", "| auto |", "| none | 1000 (18 + 982)",
                   "75%", "BM25", "titan serve (headroom)"):  # fmt: skip
        assert needle in markdown
    decile_rows = [line for line in markdown.splitlines() if line.startswith("| 1–3 |")]
    assert len(decile_rows) == 1 and decile_rows[0].count("|") == 11
    path = tmp_path / "RESULTS.md"
    path.write_text(
        "# Benchmark results\n\n<!-- cache-bench:start -->\nC\n<!-- cache-bench:end -->\n"
    )
    results_file.write_section(path, markdown, "context")
    results_file.write_section(path, markdown, "context")
    text = path.read_text()
    assert text.count(start) == 1 and "<!-- cache-bench:start -->" in text


def test_cli_registers_the_command():
    result = CliRunner().invoke(build_app(), ["context", "--help"])
    assert result.exit_code == 0 and "--quick" in result.output


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_quick_run_writes_the_section(tmp_path):
    settings = cb.ContextBenchSettings.quick(turns=6, window=512, chunks=300, queries=5)
    outcome = measure(cr.BENCHMARK, settings, tmp_path / "RESULTS.md", command="test")
    assert outcome.markdown_path.exists() and outcome.json_path.exists()
    conversation, retrieval = outcome.results["conversation"], outcome.results["retrieval"]
    assert len(conversation["trimmed"]) == len(conversation["headroom"]) == 6
    assert conversation["headroom_config"]["context"] == {"trim_headroom": 0.5}
    assert retrieval["chunks"] == 300 and retrieval["load_s"] > 0
    assert set(retrieval["rankers"]) == {"auto", "none"}
    assert all(r["queries"] == 5 for r in retrieval["rankers"].values())
