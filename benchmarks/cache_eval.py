"""How well the semantic cache tells a rephrased question from a different one.

Given labeled pairs (`cached`, `query`, `should_hit`, `kind`), it compares two policies:

- Titan's: cosine similarity of the two embeddings >= threshold AND the guards find no reason to
  refuse (a different number, entity, negation, antonym...);
- the baseline: cosine similarity >= 0.8 alone (GPTCache's default).

Recall is the share of `should_hit` pairs served from the cache; the false-hit rate is the share of
the other pairs served from it (a wrong answer). Titan's default threshold is the one with the
best recall among those whose false-hit rate is at most 1%.

The guards and the index come in as arguments, so that tests can judge the rates with a fake
guard: pass `titan.cache.guards.refusal` and `titan.cache.index.ScopedIndex`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from titan.cache.pair_training import read_pairs
from titan.loadgen.metrics import percentile

BASELINE_THRESHOLD = 0.8
MAX_FALSE_HIT_RATE = 0.01
# 0.50, 0.51, ..., 0.99 (rounded: arange's float steps would print as 0.5700000000000001).
THRESHOLDS = tuple(round(0.5 + 0.01 * step, 2) for step in range(50))

Pair = Mapping[str, Any]
Refusal = Callable[[str, str], str | None]


class Encoder(Protocol):
    def encode(self, texts: list[str]) -> Any: ...


class AsyncEmbedder(Encoder, Protocol):
    async def embed(self, text: str) -> Any: ...


class SearchIndex(Protocol):
    def add_many(self, scope: str, keys: list[str], vectors: Any) -> None: ...

    def search(self, scope: str, vector: Any, k: int = 1) -> list[tuple[str, float]]: ...


def load_pairs(path: str | Path) -> list[dict[str, Any]]:
    """The pairs of a JSON-lines file (blank lines skipped)."""
    return read_pairs(Path(path))


def similarities(pairs: Sequence[Pair], embedder: Encoder) -> np.ndarray:
    """Cosine similarity of each pair, every distinct text encoded once in one batch."""
    texts = sorted({text for pair in pairs for text in (pair["cached"], pair["query"])})
    if not texts:
        return np.zeros(0, dtype=np.float32)
    vectors = np.asarray(embedder.encode(texts), dtype=np.float32)
    # The embedder normalizes already; doing it again keeps a fake or another model honest.
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    row = {text: index for index, text in enumerate(texts)}
    cached = vectors[[row[pair["cached"]] for pair in pairs]]
    query = vectors[[row[pair["query"]] for pair in pairs]]
    return np.einsum("ij,ij->i", cached, query)


def refusals(pairs: Sequence[Pair], guards: Refusal | None) -> list[str | None]:
    """The guards' verdict on each pair (None everywhere without guards)."""
    if guards is None:
        return [None] * len(pairs)
    return [guards(pair["query"], pair["cached"]) for pair in pairs]


def rates(
    pairs: Sequence[Pair],
    sims: np.ndarray,
    threshold: float,
    refused: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """Recall, false-hit rate and precision of one policy, overall and per kind."""
    refused = refused if refused is not None else [None] * len(pairs)
    should = np.array([bool(pair["should_hit"]) for pair in pairs], dtype=bool)
    hit = (np.asarray(sims) >= threshold) & np.array([why is None for why in refused], dtype=bool)
    positives, negatives = int(should.sum()), int((~should).sum())
    true_hits, false_hits = int((hit & should).sum()), int((hit & ~should).sum())
    per_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({str(pair["kind"]) for pair in pairs}):
        mask = np.array([pair["kind"] == kind for pair in pairs], dtype=bool)
        kind_hits = int((hit & mask).sum())
        per_kind[kind] = {
            "pairs": int(mask.sum()),
            "hits": kind_hits,
            "hit_rate": kind_hits / int(mask.sum()),
            "should_hit": sorted(
                {bool(pair["should_hit"]) for pair in pairs if pair["kind"] == kind}
            ),
        }
    # Why the guards turned away near-enough pairs: what each guard buys, and what it costs.
    near = np.asarray(sims) >= threshold
    return {
        "threshold": threshold,
        "recall": true_hits / positives if positives else 0.0,
        "false_hit_rate": false_hits / negatives if negatives else 0.0,
        # With no hit at all nothing wrong was served: precision 1 by convention.
        "precision": true_hits / (true_hits + false_hits) if true_hits + false_hits else 1.0,
        "true_hits": true_hits,
        "false_hits": false_hits,
        "false_hit_rate_by_kind": {
            kind: row["hit_rate"] for kind, row in per_kind.items() if row["should_hit"] == [False]
        },
        "per_kind": per_kind,
        "refused_false_hits": dict(
            Counter(
                why for why, n, s in zip(refused, near, should, strict=True) if why and n and not s
            )
        ),
        "refused_true_hits": dict(
            Counter(why for why, n, s in zip(refused, near, should, strict=True) if why and n and s)
        ),
    }


def precision_recall_curve(
    pairs: Sequence[Pair],
    sims: np.ndarray,
    refused: Sequence[str | None] | None = None,
    thresholds: Iterable[float] = THRESHOLDS,
) -> list[dict[str, float]]:
    """Precision, recall and false-hit rate at each threshold (ascending)."""
    return [
        {key: row[key] for key in ("threshold", "precision", "recall", "false_hit_rate")}
        for row in (rates(pairs, sims, threshold, refused) for threshold in sorted(thresholds))
    ]


def choose_threshold(
    curve: Sequence[Mapping[str, float]], max_false_hit_rate: float = MAX_FALSE_HIT_RATE
) -> float | None:
    """The threshold with the best recall whose false-hit rate is within the budget; among equal
    recalls the highest threshold (the same hits, more margin against false ones)."""
    allowed = [row for row in curve if row["false_hit_rate"] <= max_false_hit_rate]
    if not allowed:
        return None
    best = max(allowed, key=lambda row: (row["recall"], row["threshold"]))
    return float(best["threshold"])


def evaluate(
    pairs: Sequence[Pair],
    embedder: Encoder,
    guards: Refusal | None,
    *,
    thresholds: Iterable[float] = THRESHOLDS,
    max_false_hit_rate: float = MAX_FALSE_HIT_RATE,
    configured_threshold: float | None = None,
) -> dict[str, Any]:
    """Titan's policy (threshold tuned here, with `guards`) against cosine >= 0.8 alone.

    `guards` is `titan.cache.guards.refusal` (or None: the threshold alone). The result holds
    the chosen threshold, each policy's rates at its threshold, and both curves; given a
    `configured_threshold` (the one Titan runs with), also Titan's rates there ("configured")."""
    sims = similarities(pairs, embedder)
    refused = refusals(pairs, guards)
    thresholds = tuple(thresholds)
    titan_curve = precision_recall_curve(pairs, sims, refused, thresholds)
    baseline_curve = precision_recall_curve(pairs, sims, None, thresholds)
    chosen = choose_threshold(titan_curve, max_false_hit_rate)
    result = {
        "pairs": len(pairs),
        "should_hit": sum(bool(pair["should_hit"]) for pair in pairs),
        "max_false_hit_rate": max_false_hit_rate,
        "threshold": chosen,
        "titan": rates(pairs, sims, chosen if chosen is not None else 1.0, refused),
        "baseline": rates(pairs, sims, BASELINE_THRESHOLD),
        "curves": {"titan": titan_curve, "baseline": baseline_curve},
    }
    if configured_threshold is not None:
        result["configured"] = rates(pairs, sims, configured_threshold, refused)
    return result


def plot_curves(result: Mapping[str, Any], path: str | Path) -> Path:
    """Precision against recall for both policies, and recall / false-hit rate against the
    threshold, into a PNG."""
    # Lazily, and through the Agg canvas rather than pyplot: no display, no global backend state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    pr, by_threshold = figure.subplots(1, 2)
    styles = {
        "titan": ("Titan (threshold + guards)", "tab:blue"),
        "baseline": ("cosine only", "tab:gray"),
    }
    for name, (label, color) in styles.items():
        curve = result["curves"][name]
        pr.plot(
            [r["recall"] for r in curve], [r["precision"] for r in curve], color=color, label=label
        )
        x = [r["threshold"] for r in curve]
        by_threshold.plot(x, [r["recall"] for r in curve], color=color, label=f"{label}: recall")
        by_threshold.plot(
            x, [r["false_hit_rate"] for r in curve], color=color, linestyle="--",
            label=f"{label}: false-hit rate",
        )  # fmt: skip
    for name, marker in (("titan", "o"), ("baseline", "s"), ("configured", "D")):
        point = result.get(name)
        if point is None or (name == "configured" and point["threshold"] == result["threshold"]):
            continue  # no configured threshold, or the chosen one: marked already
        pr.plot(point["recall"], point["precision"], marker=marker, color="black")
        suffix = {"titan": " (chosen)", "configured": " (configured)"}.get(name, "")
        if name == "titan" and result.get("configured", {}).get("threshold") == point["threshold"]:
            suffix = " (chosen = configured)"
        label = f"{point['threshold']:.2f}{suffix}"
        pr.annotate(label, (point["recall"], point["precision"]),
                    textcoords="offset points", xytext=(6, -12))  # fmt: skip
    by_threshold.axhline(
        result["max_false_hit_rate"], color="tab:red", linewidth=0.8, label="false-hit budget"
    )
    if result.get("configured") is not None:
        by_threshold.axvline(
            result["configured"]["threshold"], color="black", linestyle=":", linewidth=0.8,
            label="configured threshold",
        )  # fmt: skip
    pr.set(xlabel="recall (hit rate on should-hit pairs)", ylabel="precision", xlim=(0, 1.02))
    pr.set_title(f"Semantic cache on {result['pairs']} labeled pairs")
    by_threshold.set(xlabel="similarity threshold", ylabel="rate", ylim=(0, 1.02))
    pr.legend(loc="lower left")
    by_threshold.legend(loc="center left", fontsize="small")
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


LATENCY_QUERIES = (
    "How do I reset my password?",
    "What is the capital of Australia?",
    "How can I convert a string to an integer in Python?",
    "What are the side effects of ibuprofen?",
    "How long should I boil an egg for a soft yolk?",
    "Which is faster for dataframes, pandas or polars?",
    "Can I bring a power bank on a plane?",
    "What is the difference between TCP and UDP?",
)


def lookup_latency(
    embedder: AsyncEmbedder,
    num_entries: int,
    *,
    make_index: Callable[[int], SearchIndex],
    lookups: int = 200,
    k: int = 1,
    seed: int = 0,
) -> dict[str, float]:
    """The cost of one semantic lookup: embed the query for real (`embedder.embed`, its thread hop
    included), then search a scope holding `num_entries` random unit vectors (their content
    doesn't change the search cost). Returns milliseconds: p50/p99 of the whole lookup and of
    each part. Building the index is not timed (100,000 entries take about a minute)."""
    probe = np.asarray(embedder.encode(["probe"]), dtype=np.float32)
    dim = probe.shape[-1]
    rng = np.random.default_rng(seed)
    index = make_index(dim)
    for start in range(0, num_entries, 10_000):
        count = min(10_000, num_entries - start)
        vectors = rng.standard_normal((count, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index.add_many("bench", [f"entry-{start + i}" for i in range(count)], vectors)
    queries = [random.Random(seed + i).choice(LATENCY_QUERIES) for i in range(lookups)]

    async def measure() -> tuple[list[float], list[float]]:
        embed_s, search_s = [], []
        for query in queries:
            started = time.perf_counter()
            vector = await embedder.embed(query)
            embedded = time.perf_counter()
            index.search("bench", vector, k)
            embed_s.append(embedded - started)
            search_s.append(time.perf_counter() - embedded)
        return embed_s, search_s

    embed_s, search_s = asyncio.run(measure())
    total_ms = [1e3 * (a + b) for a, b in zip(embed_s, search_s, strict=True)]
    embed_ms, search_ms = [1e3 * s for s in embed_s], [1e3 * s for s in search_s]
    return {
        "entries": float(num_entries),
        "p50_ms": percentile(total_ms, 50),
        "p99_ms": percentile(total_ms, 99),
        "embed_p50_ms": percentile(embed_ms, 50),
        "search_p50_ms": percentile(search_ms, 50),
        "search_p99_ms": percentile(search_ms, 99),
    }


class TimedEmbedder:
    """The embedder as the cache uses it, timing its models: each ``embed`` and each pair
    verifier's ``pair_probability`` (their thread hops included)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self._spent_s = 0.0
        self._pairs = 0

    def encode(self, texts: list[str]) -> Any:
        return self.inner.encode(texts)

    async def embed(self, text: str) -> Any:
        started = time.perf_counter()
        try:
            return await self.inner.embed(text)
        finally:
            self._spent_s += time.perf_counter() - started

    async def pair_probability(self, cached: str, asked: str) -> Any:
        self._pairs += 1
        started = time.perf_counter()
        try:
            return await self.inner.pair_probability(cached, asked)
        finally:
            self._spent_s += time.perf_counter() - started

    def take(self) -> float:
        """Seconds spent in the models since the last call."""
        spent, self._spent_s = self._spent_s, 0.0
        return spent

    def take_pairs(self) -> int:
        """Pairs verified since the last call."""
        pairs, self._pairs = self._pairs, 0
        return pairs
