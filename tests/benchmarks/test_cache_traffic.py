"""The simulated traffic of the cache benchmark: candidates found as the cache walks them, truth
from the labels, fixed thresholds against the error budget. Hand-made vectors, no model."""

from __future__ import annotations

import numpy as np

from benchmarks import cache_traffic
from titan.cache.error_budget import ErrorBudget


class TableEncoder:
    """Each text's vector by hand: a base direction per cached question, and each query that
    direction tilted to a chosen cosine."""

    def __init__(self, cosines: dict[str, tuple[str, float]]):
        rng = np.random.default_rng(0)
        self.vectors: dict[str, np.ndarray] = {}
        for query, (cached, cosine) in cosines.items():
            if cached not in self.vectors:
                base = rng.standard_normal(16)
                self.vectors[cached] = base / np.linalg.norm(base)
            noise = rng.standard_normal(16)
            base = self.vectors[cached]
            noise -= noise.dot(base) * base
            noise /= np.linalg.norm(noise)
            self.vectors[query] = cosine * base + np.sqrt(1 - cosine**2) * noise

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.array([self.vectors[text] for text in texts])


def no_guards(query: str, cached: str) -> str | None:
    return None


PAIRS = [
    {"cached": f"c{i}", "query": f"q{i}", "should_hit": i % 4 != 0, "kind": "k"} for i in range(40)
]
# Paraphrases at 0.85-0.95; every fourth query a near miss at 0.97, above them all.
COSINES = {f"q{i}": (f"c{i}", 0.97 if i % 4 == 0 else 0.85 + 0.0025 * i) for i in range(40)}


def test_candidates_take_the_labels_and_respect_the_floor_and_guards():
    encoder = TableEncoder(COSINES)
    cached, found = cache_traffic.candidates(PAIRS, encoder, no_guards, floor=0.8)
    assert len(cached) == 40
    assert found["q0"].is_right is False and abs(found["q0"].similarity - 0.97) < 1e-5
    assert found["q1"].is_right is True and cached[found["q1"].entry] == "c1"
    _, strict = cache_traffic.candidates(PAIRS, encoder, no_guards, floor=0.96)
    assert strict["q1"] is None and strict["q0"] is not None
    _, guarded = cache_traffic.candidates(PAIRS, encoder, lambda q, c: "no", floor=0.8)
    assert all(candidate is None for candidate in guarded.values())


def test_no_fixed_threshold_keeps_within_budget_where_the_error_budget_does():
    encoder = TableEncoder(COSINES)
    _, found = cache_traffic.candidates(PAIRS, encoder, no_guards, floor=0.8)
    requests = cache_traffic.traffic(PAIRS, 5000, seed=1)
    labels = cache_traffic.labels_of(PAIRS)
    fixed = [
        cache_traffic.run_fixed(requests, found, labels, t) for t in cache_traffic.FIXED_THRESHOLDS
    ]
    best = cache_traffic.best_fixed(fixed, 0.05)  # the wrong ones are the most similar
    assert best is not None and best["hit_rate"] == 0.0
    learned = cache_traffic.run_budget(
        requests, found, labels, ErrorBudget, max_error_rate=0.05, floor=0.8, verify_fraction=0.05,
        min_verifications=1, seed=1,
    )  # fmt: skip
    assert learned["error_rate"] <= 0.05
    assert learned["hit_rate"] > 0.2  # the paraphrases' entries, once verified, are served
    assert learned["paraphrase_hit_rate"] > 0.3 and learned["near_miss_hit_rate"] < 0.05
    assert learned["extra_calls_per_1000"] > 0
    # Every paraphrase request not served has one cause, and served + causes make them all.
    losses = learned["paraphrase_losses"]
    assert set(losses) <= {
        "no candidate", "nearest is another question", "entry not yet verified",
        "entry failed at this similarity", "no threshold learned yet",
        "below the learned threshold", "sampled for verification",
    }  # fmt: skip
    assert losses["entry not yet verified"] > 0 and losses["no threshold learned yet"] > 0
    assert abs(learned["paraphrase_hit_rate"] + sum(losses.values()) - 1) < 1e-9


def test_traffic_repeats_popular_queries():
    requests = cache_traffic.traffic(PAIRS, 2000, seed=0)
    counts = sorted((requests.count(q) for q in set(requests)), reverse=True)
    assert counts[0] > 5 * counts[len(counts) // 2]
    assert requests == cache_traffic.traffic(PAIRS, 2000, seed=0)
