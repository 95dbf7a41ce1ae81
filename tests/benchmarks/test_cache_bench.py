"""The cache benchmark end to end, quick, with a fake embedder (words hashed to vectors): the
report's structure, not its numbers; then (slow) `python -m benchmarks cache --quick` with the real
all-MiniLM-L6-v2. No timing thresholds: speed targets belong to the report, not to tests."""

from __future__ import annotations

import re
import zlib
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from benchmarks import cache_bench, results_file
from benchmarks.base import measure
from benchmarks.cache_bench import PNG_NAME, CacheBenchSettings, TimedEmbedder
from benchmarks.cache_report import BENCHMARK, SECTION_END, SECTION_START, render_markdown
from titan.cache.response_cache import EMBEDDING_DIM
from titan.config.cache import CacheConfig
from titan.service.cache_replay import replay_whole

OTHER_START, OTHER_END = results_file.markers("engine")
OTHER = f"# Benchmark results\n\n{OTHER_START}\n## Engine\n\nkept as it is\n{OTHER_END}\n"


class HashingEmbedder:
    """Each word a fixed random direction; a text the normalized sum of its words': texts that
    share most words are close, as paraphrases and near misses are."""

    def __init__(self) -> None:
        self.num_embedded = 0

    def _word(self, word: str) -> np.ndarray:
        return np.random.default_rng(zlib.crc32(word.encode())).standard_normal(EMBEDDING_DIM)

    def encode(self, texts: list[str]) -> list[tuple[float, ...]]:
        vectors = []
        for text in texts:
            words = re.findall(r"\w+", text.lower()) or ["<empty>"]
            vector = sum(self._word(word) for word in words)
            vectors.append(tuple(float(x) for x in vector / np.linalg.norm(vector)))
        return vectors

    async def embed(self, text: str) -> tuple[float, ...]:
        self.num_embedded += 1
        return self.encode([text])[0]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("cache-bench") / "bench" / "RESULTS.md"
    output.parent.mkdir()
    output.write_text(OTHER)
    replayed = []

    def replay(value: bytes, endpoint: str):
        replayed.append(endpoint)
        return replay_whole(value, endpoint)

    embedder = HashingEmbedder()
    settings = CacheBenchSettings.quick(
        lookups=30, overhead_requests=30, warmup=2, figures_dir=str(output.parent)
    )
    run = partial(cache_bench.run, embedder=embedder, replay=replay)
    outcome = measure(
        replace(BENCHMARK, run=run), settings, output, command="python -m benchmarks x"
    )
    return outcome, settings, output, replayed, embedder


def test_the_section_replaces_only_its_own_and_links_the_curves(quick_run):
    outcome, _, output, _, _ = quick_run
    text = output.read_text()
    assert outcome.markdown_path == output
    assert text.startswith(OTHER.rstrip("\n")) and "kept as it is" in text
    assert text.count(SECTION_START) == text.count(SECTION_END) == 1
    section = text[text.index(SECTION_START) :]
    for heading in ("### Targets", "### Semantic matching on the labeled pairs",
                    "### Lookup latency", "### Per-request overhead"):  # fmt: skip
        assert heading in section
    assert f"![Precision/recall and rates by threshold]({PNG_NAME})" in section
    assert "Quick variant" in section and "`python -m benchmarks x`" in section
    assert "usearch" in section and "sentence-transformers" in section
    assert outcome.results["meta"]["png"] == str(output.parent / PNG_NAME)
    assert (output.parent / PNG_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Rendered again (a second run), the section is replaced, not added.
    results_file.write_section(output, render_markdown(outcome.results), "cache")
    assert output.read_text().count(SECTION_START) == 1 and "kept as it is" in output.read_text()


def test_every_target_has_a_verdict(quick_run):
    outcome, _, output, _, _ = quick_run
    targets = outcome.results["targets"]
    # The held-out sets' two rates each, the realized error at each max_error_rate, held-out
    # traffic, latency.
    assert len(targets) == 33  # two of them for each of the thirteen held-out sets
    assert all(isinstance(t["passed"], bool) and t["value"] is not None for t in targets)
    target_rows = output.read_text().split("### Targets")[1].split("###")[0]
    assert len(re.findall(r"\| (PASS|FAIL) \|", target_rows)) == len(targets)


def test_the_evaluation_compares_the_configured_policy_with_the_baseline(quick_run):
    outcome, settings, _, _, _ = quick_run
    evaluation = outcome.results["evaluation"]
    assert evaluation["configured"]["threshold"] == CacheConfig().threshold
    assert evaluation["baseline"]["threshold"] == 0.8
    assert evaluation["pairs"] == sum(evaluation["kinds"].values()) > 50
    assert set(evaluation["kinds"]) >= {"paraphrase", "negation", "number"}
    assert len(evaluation["curves"]["titan"]) == len(evaluation["curves"]["baseline"]) == 50
    assert settings.pair_stride == 4
    # Held-out pairs that are training pairs word for word are counted, the rest rated apart.
    per_set = outcome.results["per_set"]
    assert all("also_in_training" not in per_set[name] for name in ("project", "written"))
    for name in ("heldout", "heldout_e"):
        assert 0 <= per_set[name]["also_in_training"] < per_set[name]["pairs"]
        assert 0 <= per_set[name]["unseen_false_hit_rate"] <= 1


def test_latency_and_overheads_at_each_size(quick_run):
    outcome, settings, _, replayed, embedder = quick_run
    sizes = outcome.results["sizes"]
    assert [row["filler_entries"] for row in sizes] == list(settings.sizes)
    assert [row["index"] for row in sizes] == ["exact (numpy)", "HNSW (usearch)"]
    for row in sizes:
        assert row["indexed_entries"] > row["filler_entries"]  # plus the pairs' cached questions
        latency, overheads = row["latency"], row["overheads"]
        assert latency["lookup"]["n"] == latency["embed"]["n"] == settings.lookups
        assert sum(latency["outcomes"].values()) == settings.lookups
        # Neighbours above the threshold: served, or turned away by the guards.
        reached = latency["outcomes"].get("hit-semantic", 0) + sum(
            latency["guard_refusals"].values()
        )
        assert reached > 0
        assert 0 < latency["embed"]["p50_ms"] <= latency["lookup"]["p50_ms"]
        assert latency["lookup"]["p50_ms"] <= latency["lookup"]["p99_ms"]
        assert overheads["exact_hit"]["n"] == overheads["miss_beyond_embed"]["n"]
        assert overheads["exact_hit"]["n"] == settings.overhead_requests
        assert overheads["miss_embed"]["p50_ms"] > 0
    assert len(replayed) == sum(row["overheads"]["exact_hit"]["n"] for row in sizes)
    assert set(replayed) == {"chat"}
    assert embedder.num_embedded > 0


def test_the_raw_numbers_are_written_beside(quick_run):
    outcome, _, output, _, _ = quick_run
    assert outcome.json_path.parent == output.parent / "out"
    assert outcome.json_path.name.startswith("cache-")
    raw = orjson.loads(outcome.json_path.read_bytes())
    assert raw["targets"] == outcome.results["targets"]
    assert raw["meta"]["embedder"] == "HashingEmbedder"


async def test_the_timed_embedder_adds_up_its_calls():
    timed = TimedEmbedder(HashingEmbedder())
    await timed.embed("one two three")
    await timed.embed("four five six")
    assert timed.take() > 0 and timed.take() == 0.0
    assert len(timed.encode(["a b"])[0]) == EMBEDDING_DIM


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_the_command_with_the_real_model(tmp_path: Path):
    from benchmarks.cli import build_app

    output = tmp_path / "RESULTS.md"
    result = CliRunner().invoke(build_app(), ["cache", "--quick", "--output", str(output)])
    assert result.exit_code == 0, result.output
    section = output.read_text()
    assert SECTION_START in section and "all-MiniLM-L6-v2 on CPU" in section
    assert (tmp_path / PNG_NAME).exists()


def test_the_embedders_table_compares_with_the_same_runs_baseline():
    from benchmarks.cache_report import _embedder_lines

    row = {"n": 400, "mean_ms": 1.0}
    lines = _embedder_lines({
        "titan": {"kind": "MiniLM Q8_0", "p50_ms": 4.0, "p99_ms": 10.0, **row},
        "float32": {"kind": "sentence-transformers float32", "p50_ms": 14.0, "p99_ms": 25.0, **row},
    })  # fmt: skip
    text = "\n".join(lines)
    assert "p50 3.5x faster, p99 2.5x" in text
    assert "| Titan | MiniLM Q8_0 | 400 | 4.00 | 10.00 |" in text
    assert _embedder_lines(None) == []
