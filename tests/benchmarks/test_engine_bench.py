"""The engine benchmark end to end, in its quick variant: it runs, measures every system and
writes its report without touching other sections. No timing thresholds: speed targets belong
to the benchmark report, not to tests."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from benchmarks.base import measure
from benchmarks.engine_report import BENCHMARK, NAME, SECTION_END, SECTION_START
from benchmarks.results_file import write_section
from benchmarks.workload import BenchSettings, build_workload
from titan.loadgen.metrics import percentile

OTHER_SECTION = (
    "# Benchmark results\n\n"
    "<!-- gateway-bench:start -->\n## Gateway benchmark\n\nkept as it is\n"
    "<!-- gateway-bench:end -->\n"
)
SYSTEMS = ("titan", "hf_sequential", "hf_static_batch")


class _FakeChatTokenizer:
    """One token per character: exact lengths without loading a model."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        turns = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return turns + ("<assistant>" if add_generation_prompt else "")


def test_workload_is_deterministic_and_spread_across_the_ranges():
    tokenizer = _FakeChatTokenizer()
    requests = build_workload(tokenizer, 32, 7, (200, 1024), (16, 256))
    again = build_workload(tokenizer, 32, 7, (200, 1024), (16, 256))
    assert requests == again
    lengths = sorted(r.num_prompt_tokens for r in requests)
    assert lengths[0] == 200 and lengths[-1] == 1024
    assert len({length // 100 for length in lengths}) >= 8  # every part of the range
    assert min(r.max_tokens for r in requests) == 16
    assert max(r.max_tokens for r in requests) == 256
    assert build_workload(tokenizer, 32, 8, (200, 1024), (16, 256)) != requests


def test_prompt_keeps_the_chat_template_intact():
    tokenizer = _FakeChatTokenizer()
    (request,) = build_workload(tokenizer, 1, 0, (250, 250), (4, 4))
    text = "".join(chr(t) for t in request.prompt_token_ids)
    assert len(request.prompt_token_ids) == 250
    assert text.startswith("<system>") and text.endswith("</user><assistant>")


def test_percentile_interpolates_like_numpy():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)


def test_section_replaces_only_its_own_markers(tmp_path: Path):
    path = tmp_path / "RESULTS.md"
    write_section(path, f"{SECTION_START}\nfirst\n{SECTION_END}\n", NAME)
    path.write_text(path.read_text() + "\n## Later section\n")
    write_section(path, f"{SECTION_START}\nsecond\n{SECTION_END}\n", NAME)
    text = path.read_text()
    assert "second" in text and "first" not in text and "## Later section" in text
    assert text.count(SECTION_START) == text.count(SECTION_END) == 1


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_quick_benchmark_measures_every_system_and_keeps_other_sections(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(OTHER_SECTION)

    outcome = measure(BENCHMARK, BenchSettings.quick(), output, command="pytest quick bench")

    text = output.read_text()
    assert text.startswith(OTHER_SECTION.rstrip("\n"))
    assert text.count(SECTION_START) == 1 and text.count(SECTION_END) == 1
    assert text.index(SECTION_START) < text.index(SECTION_END)
    assert "ignore_eos" in text
    assert "PASS" in text or "MISS" in text

    results = orjson.loads(outcome.json_path.read_bytes())
    assert outcome.json_path.parent == tmp_path / "out"
    assert set(results) >= {
        "meta",
        "workload",
        "systems",
        "titan_engine_stats",
        "single_stream",
        "head_of_line",
        "targets",
    }
    assert results["meta"]["command"] == "pytest quick bench"
    assert results["meta"]["num_threads"] >= 1
    request_ids = {r["request_id"] for r in results["workload"]["requests"]}
    assert len(request_ids) == 4
    for name in SYSTEMS:
        run = results["systems"][name]
        assert run["tokens_per_s"] > 0
        assert run["num_generated_tokens"] == results["workload"]["num_generated_tokens"]
        assert set(run["ttft_s"]) == request_ids
        assert all(0 < ttft <= run["wall_s"] for ttft in run["ttft_s"].values())
    for run in results["single_stream"].values():
        assert run["decode_tokens_per_s"] > 0
    hol = results["head_of_line"]
    assert hol["long_prompt_tokens"] == 200
    assert 0 < hol["median_gap_s"] <= hol["worst_gap_s"]
    assert hol["long_prompt_ttft_s"] > 0
    assert {t["passed"] for t in results["targets"]} <= {True, False}
    assert len(results["targets"]) == 5
    load = results["server_load"]
    assert load["under_load"]["num_probes"] > 0 and load["idle"]["num_probes"] == 10
    assert 0 < load["under_load"]["p50_ms"] <= load["under_load"]["max_ms"]
