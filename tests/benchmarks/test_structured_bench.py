"""The structured-output benchmark in its quick variant: it runs both batches, times compiles and
writes its section without touching the others. No timing thresholds (speed belongs in the
report, not in tests)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from benchmarks.base import measure
from benchmarks.structured_bench import StructuredBenchSettings
from benchmarks.structured_report import BENCHMARK

pytestmark = pytest.mark.slow

OTHER_SECTION = (
    "# Benchmark results\n\n"
    "<!-- engine-bench:start -->\n## Engine benchmark\n\nkept as it is\n"
    "<!-- engine-bench:end -->\n"
)


@pytest.mark.bench_smoke
def test_quick_run_measures_both_batches_and_writes_its_section(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(OTHER_SECTION)
    outcome = measure(BENCHMARK, StructuredBenchSettings.quick(dtype="float32"), output)
    results = outcome.results
    for mode in ("none", "half"):
        (batch,) = results["rounds"][mode]
        assert batch["num_tokens"] > 0 and batch["tokens_per_s"] > 0
    # Free requests ignore EOS: 4 requests x 24 tokens (the schema's shortest answer is ~17).
    assert results["rounds"]["none"][0]["num_tokens"] == 4 * 24
    assert results["compile"]["first_ms"] > results["compile"]["cached_ms"] >= 0
    text = output.read_text()
    assert "kept as it is" in text
    assert "<!-- structured-bench:start -->" in text and "llguidance" in text
    assert orjson.loads(outcome.json_path.read_bytes())["summary"] == results["summary"]
