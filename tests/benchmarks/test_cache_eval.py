"""The semantic cache evaluation: rates computed right on hand-made pairs whose similarities a fake
embedder fixes, the threshold choice, the plot and the latency helper; then (slow) the real
all-MiniLM-L6-v2 on the labeled pairs of tests/data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import cache_eval
from titan.cache.guards import refusal
from titan.cache.index import ScopedIndex

DATA = Path(__file__).resolve().parents[2] / "titan" / "cache" / "training" / "project_pairs.jsonl"


class FakeEmbedder:
    """Every cached question is (1, 0); a query is the unit vector whose cosine with it is the
    similarity written in the pair table."""

    def __init__(self, vectors: dict[str, tuple[float, float]]):
        self.vectors = vectors
        self.calls: list[list[str]] = []

    def encode(self, texts: list[str]) -> list[tuple[float, float]]:
        self.calls.append(list(texts))
        return [self.vectors.get(text, (0.6, 0.8)) for text in texts]

    async def embed(self, text: str) -> tuple[float, float]:
        return self.encode([text])[0]


# (query, similarity to its cached question, should_hit, kind); the fake guard refuses "not".
TABLE = [
    ("p1", 0.955, True, "paraphrase"),
    ("p2", 0.855, True, "paraphrase"),
    ("p3", 0.705, True, "paraphrase"),
    ("not n1", 0.975, False, "negation"),
    ("n2", 0.925, False, "number"),
    ("o1", 0.605, False, "other_question"),
]


def fake_guard(query: str, cached: str) -> str | None:
    return "negation" if "not" in query else None


@pytest.fixture
def pairs_and_embedder():
    vectors: dict[str, tuple[float, float]] = {}
    pairs = []
    for query, similarity, should_hit, kind in TABLE:
        cached = f"cached for {query}"
        vectors[cached] = (1.0, 0.0)
        vectors[query] = (similarity, math.sqrt(1 - similarity**2))
        pairs.append({"cached": cached, "query": query, "should_hit": should_hit, "kind": kind})
    return pairs, FakeEmbedder(vectors)


def test_similarities_encode_each_text_once(pairs_and_embedder):
    pairs, embedder = pairs_and_embedder
    pairs = [*pairs, {**pairs[0], "kind": "again"}]  # the same texts twice
    sims = cache_eval.similarities(pairs, embedder)
    assert len(embedder.calls) == 1 and len(embedder.calls[0]) == 12
    expected = [row[1] for row in TABLE] + [TABLE[0][1]]
    assert sims == pytest.approx(expected, abs=1e-6)


def test_rates_with_and_without_guards(pairs_and_embedder):
    pairs, embedder = pairs_and_embedder
    sims = cache_eval.similarities(pairs, embedder)
    refused = cache_eval.refusals(pairs, fake_guard)
    titan = cache_eval.rates(pairs, sims, 0.9, refused)
    assert titan["recall"] == pytest.approx(1 / 3)  # p1
    assert titan["false_hit_rate"] == pytest.approx(1 / 3)  # n2; "not n1" refused
    assert titan["precision"] == pytest.approx(1 / 2)
    assert titan["false_hit_rate_by_kind"] == {
        "negation": 0.0,
        "number": 1.0,
        "other_question": 0.0,
    }
    assert titan["per_kind"]["paraphrase"]["hit_rate"] == pytest.approx(1 / 3)
    assert titan["refused_false_hits"] == {"negation": 1} and titan["refused_true_hits"] == {}

    baseline = cache_eval.rates(pairs, sims, cache_eval.BASELINE_THRESHOLD)
    assert baseline["recall"] == pytest.approx(2 / 3)  # p1, p2
    assert baseline["false_hit_rate"] == pytest.approx(2 / 3)  # not n1, n2
    assert baseline["false_hit_rate_by_kind"]["negation"] == 1.0

    nothing = cache_eval.rates(pairs, sims, 0.99, refused)
    assert nothing["recall"] == nothing["false_hit_rate"] == 0.0
    assert nothing["precision"] == 1.0


def test_curve_and_threshold_choice(pairs_and_embedder):
    pairs, embedder = pairs_and_embedder
    sims = cache_eval.similarities(pairs, embedder)
    refused = cache_eval.refusals(pairs, fake_guard)
    curve = cache_eval.precision_recall_curve(pairs, sims, refused)
    assert [row["threshold"] for row in curve] == list(cache_eval.THRESHOLDS)
    assert curve[0]["threshold"] == 0.5 and curve[-1]["threshold"] == 0.99
    recalls = [row["recall"] for row in curve]
    assert recalls == sorted(recalls, reverse=True)
    # No false hit allowed: above n2 (0.925); p1 (0.955) is the best recall, kept up to 0.95.
    assert cache_eval.choose_threshold(curve) == 0.95
    # One false hit in three allowed: every paraphrase hits from 0.70 down to 0.61.
    assert cache_eval.choose_threshold(curve, max_false_hit_rate=0.34) == 0.7
    assert (
        cache_eval.choose_threshold([{"threshold": 0.5, "recall": 1, "false_hit_rate": 1}]) is None
    )


def test_evaluate_and_plot(pairs_and_embedder, tmp_path):
    pairs, embedder = pairs_and_embedder
    result = cache_eval.evaluate(pairs, embedder, fake_guard)
    assert result["threshold"] == 0.95
    assert result["pairs"] == 6 and result["should_hit"] == 3
    assert result["titan"]["threshold"] == 0.95 and result["titan"]["false_hit_rate"] == 0.0
    assert result["baseline"]["threshold"] == 0.8
    assert len(result["curves"]["titan"]) == len(result["curves"]["baseline"]) == 50
    unguarded = cache_eval.evaluate(pairs, embedder, None)
    assert unguarded["curves"]["titan"] == unguarded["curves"]["baseline"]
    # Above "not n1" (0.975) nothing hits: recall 0 everywhere, so the highest threshold.
    assert unguarded["threshold"] == 0.99 and unguarded["titan"]["recall"] == 0.0

    png = cache_eval.plot_curves(result, tmp_path / "pr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        '{"cached": "a b c", "query": "a b d", "should_hit": false, "kind": "other_question"}\n\n'
    )
    assert cache_eval.load_pairs(path) == [
        {"cached": "a b c", "query": "a b d", "should_hit": False, "kind": "other_question"}
    ]


def test_lookup_latency_with_a_fake_embedder(pairs_and_embedder):
    _, embedder = pairs_and_embedder
    timings = cache_eval.lookup_latency(embedder, 300, make_index=ScopedIndex, lookups=20)
    assert timings["entries"] == 300
    assert 0 < timings["p50_ms"] <= timings["p99_ms"]
    assert 0 < timings["search_p50_ms"] <= timings["search_p99_ms"]


@pytest.fixture(scope="module")
def minilm():
    from titan.cache.embedder import Embedder

    return Embedder.load()


@pytest.mark.slow
def test_the_labeled_pairs_with_the_real_model(minilm):
    """The numbers the default threshold comes from: within the false-hit budget with useful
    recall, and far fewer false hits than plain cosine >= 0.8."""
    if not DATA.exists():
        pytest.skip(f"{DATA} is missing")
    pairs = cache_eval.load_pairs(DATA)
    result = cache_eval.evaluate(pairs, minilm, refusal)
    titan, baseline = result["titan"], result["baseline"]
    assert result["threshold"] is not None and 0.8 <= result["threshold"] <= 0.95
    assert titan["false_hit_rate"] <= cache_eval.MAX_FALSE_HIT_RATE
    assert titan["recall"] >= 0.6
    assert baseline["false_hit_rate"] > 10 * max(titan["false_hit_rate"], 0.01)


@pytest.mark.slow
def test_lookup_latency_with_the_real_model(minilm):
    timings = cache_eval.lookup_latency(minilm, 5_000, make_index=ScopedIndex, lookups=10)
    assert 0 < timings["embed_p50_ms"] <= timings["p50_ms"] <= timings["p99_ms"]
    assert np.isfinite(timings["search_p99_ms"])
