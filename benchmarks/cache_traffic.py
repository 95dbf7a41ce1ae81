"""Simulated traffic for the semantic cache's error budget: does the realized error stay within
``max_error_rate``, and how many hits does it leave compared with a fixed threshold?

The cache holds the answers to every distinct ``cached`` question of the labeled pairs. Requests
are the pairs' queries, drawn with Zipf-like popularity (so that questions repeat, as in real
traffic), every repeat a semantic decision (as with exact caching off). Each lookup walks its
nearest cached questions as ``ResponseCache`` does: the first at or above the floor that the
guards let through is the candidate. Whether serving it is right comes from the labels: the
pair's ``should_hit`` when the candidate is the pair's own cached question, right when it is
the same text, wrong otherwise (another question's answer). A verification's outcome is that
same truth, as the answers' comparison would give it for a model that answers consistently.

Policies: the error budget (``titan.cache.error_budget``, the server's defaults) at each
``max_error_rate``; and fixed thresholds with the guards, from the floor to 0.99, whose best
within each budget is picked in hindsight on this very traffic (the strongest fixed baseline:
tuned on the data it is judged on).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.cache_eval import Encoder, Pair

Refusal = Callable[[str, str], str | None]
NUM_CANDIDATES = 4  # as the cache walks them
FIXED_THRESHOLDS = tuple(round(0.8 + 0.01 * step, 2) for step in range(20))


@dataclass(frozen=True)
class Candidate:
    """What a lookup of one query finds: the cached question it would answer with."""

    similarity: float
    entry: int  # index into the cached questions
    is_right: bool


def candidates(
    pairs: Sequence[Pair], encoder: Encoder, guards: Refusal, floor: float
) -> tuple[list[str], dict[str, Candidate | None]]:
    """The cached questions, and for each distinct query its candidate (None: nothing at or
    above the floor passes the guards)."""
    cached = sorted({str(pair["cached"]) for pair in pairs})
    queries = sorted({str(pair["query"]) for pair in pairs})
    labels = {(str(p["cached"]), str(p["query"])): bool(p["should_hit"]) for p in pairs}
    vectors = np.asarray(encoder.encode(cached + queries), dtype=np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    entries, asked = vectors[: len(cached)], vectors[len(cached) :]
    scores = asked @ entries.T
    found: dict[str, Candidate | None] = {}
    for row, query in enumerate(queries):
        found[query] = None
        for column in np.argsort(-scores[row])[:NUM_CANDIDATES]:
            similarity = float(scores[row, column])
            if similarity < floor:
                break
            if guards(query, cached[column]) is not None:
                continue
            is_right = labels.get((cached[column], query), cached[column] == query)
            found[query] = Candidate(similarity, int(column), is_right)
            break
    return cached, found


def traffic(pairs: Sequence[Pair], num_requests: int, seed: int) -> list[str]:
    """Queries drawn with Zipf-like popularity (exponent 1) over a seeded shuffle of them."""
    queries = sorted({str(pair["query"]) for pair in pairs})
    rng = random.Random(seed)
    rng.shuffle(queries)
    weights = [1.0 / (rank + 1) for rank in range(len(queries))]
    return rng.choices(queries, weights=weights, k=num_requests)


def labels_of(pairs: Sequence[Pair]) -> dict[str, bool]:
    """Each query's label: whether it should be served the cached answer of its pair."""
    labels: dict[str, bool] = {}
    for pair in pairs:
        query = str(pair["query"])
        labels[query] = labels.get(query, True) and bool(pair["should_hit"])
    return labels


def _tally(
    requests: Sequence[str],
    served: Sequence[bool],
    wrong: int,
    labels: dict[str, bool],
    extra: int = 0,
) -> dict[str, float]:
    """Rates over the requests: hits, wrong answers among hits, and the hit rates of
    paraphrase requests and of near-miss requests (the static set's recall and false-hit rate,
    on traffic)."""
    num_served = sum(served)
    by_label = {True: [0, 0], False: [0, 0]}  # label -> [requests, served]
    for query, is_served in zip(requests, served, strict=True):
        counts = by_label[labels.get(query, False)]
        counts[0] += 1
        counts[1] += is_served
    return {
        "hit_rate": num_served / len(requests),
        "error_rate": wrong / num_served if num_served else 0.0,  # wrong among hits served
        "wrong_per_request": wrong / len(requests),
        "served": num_served,
        "wrong": wrong,
        "paraphrase_hit_rate": by_label[True][1] / max(1, by_label[True][0]),
        "near_miss_hit_rate": by_label[False][1] / max(1, by_label[False][0]),
        "extra_calls_per_1000": 1000 * extra / len(requests),
    }


def run_fixed(
    requests: Sequence[str],
    found: dict[str, Candidate | None],
    labels: dict[str, bool],
    threshold: float,
) -> dict[str, float]:
    hits = [found[q] for q in requests]
    served = [c is not None and c.similarity >= threshold for c in hits]
    wrong = sum(c is not None and not c.is_right for c, s in zip(hits, served, strict=True) if s)
    return {"threshold": threshold, **_tally(requests, served, wrong, labels)}


def run_budget(
    requests: Sequence[str],
    found: dict[str, Candidate | None],
    labels: dict[str, bool],
    make_budget: Callable[[random.Random], Any],
    *,
    max_error_rate: float,
    floor: float,
    verify_fraction: float,
    min_verifications: int,
    seed: int,
) -> dict[str, float]:
    """The error budget over the traffic; its final threshold and its cost come with it."""
    budget = make_budget(random.Random(seed))
    model = budget.model("bench", floor=floor, max_error_rate=max_error_rate)
    served: list[bool] = []
    wrong = 0
    losses: Counter[str] = Counter()  # why paraphrase requests were not served
    for query in requests:
        candidate = found[query]
        if candidate is None:
            served.append(False)
            losses["no candidate"] += labels.get(query, False)
            continue
        key = str(candidate.entry)
        cause = _cause(model, key, candidate, min_verifications)  # before the decision learns
        decision = budget.decide(
            model, key, candidate.similarity,
            verify_fraction=verify_fraction, min_verifications=min_verifications,
        )  # fmt: skip
        served.append(decision.action == "serve")
        if decision.action == "serve":
            wrong += not candidate.is_right
        elif decision.action == "verify":
            budget.record(
                model, key, candidate.similarity, candidate.is_right, decision.is_eligible
            )
        if decision.action != "serve" and labels.get(query, False):
            losses[cause] += 1
    report = budget.report()["bench"]
    paraphrases = sum(labels.get(query, False) for query in requests)
    return {
        "max_error_rate": max_error_rate,
        "final_threshold": report["threshold"],
        "verifications": report["verifications"],
        "paraphrase_losses": {cause: n / max(1, paraphrases) for cause, n in losses.items()},
        **_tally(requests, served, wrong, labels, report["extra_model_calls"]),
    }


def _cause(model: Any, key: str, candidate: Candidate, min_verifications: int) -> str:
    """Why the budget would not serve this candidate, were it not served."""
    entry = model.entries.get(key)
    if not candidate.is_right:
        return "nearest is another question"
    if entry is None or entry.right < min_verifications:
        return "entry not yet verified"
    if candidate.similarity <= entry.failed_at:
        return "entry failed at this similarity"
    if model.threshold is None:
        return "no threshold learned yet"
    if candidate.similarity < model.threshold:
        return "below the learned threshold"
    return "sampled for verification"


def best_fixed(rows: Sequence[dict[str, float]], max_error_rate: float) -> dict[str, float] | None:
    """The fixed threshold with the most hits whose realized error is within the budget."""
    allowed = [row for row in rows if row["error_rate"] <= max_error_rate]
    return max(allowed, key=lambda row: row["hit_rate"]) if allowed else None


def simulate(
    pairs: Sequence[Pair],
    encoder: Encoder,
    guards: Refusal,
    make_budget: Callable[[random.Random], Any],
    *,
    num_requests: int,
    budgets: Sequence[float],
    seeds: Sequence[int],
    floor: float,
    verify_fraction: float,
    min_verifications: int,
) -> dict[str, Any]:
    """Per seed: the fixed thresholds' curve, and the error budget at each ``budgets`` value;
    the comparison at each budget with the best fixed threshold in hindsight."""
    _, found = candidates(pairs, encoder, guards, floor)
    labels = labels_of(pairs)
    runs = []
    for seed in seeds:
        requests = traffic(pairs, num_requests, seed)
        fixed = [run_fixed(requests, found, labels, t) for t in FIXED_THRESHOLDS]
        options = {
            "floor": floor, "verify_fraction": verify_fraction,
            "min_verifications": min_verifications, "seed": seed,
        }  # fmt: skip
        learned = [
            run_budget(requests, found, labels, make_budget, max_error_rate=delta, **options)
            for delta in budgets
        ]
        runs.append({
            "seed": seed, "fixed": fixed, "budget": learned,
            "best_fixed": {str(delta): best_fixed(fixed, delta) for delta in budgets},
        })  # fmt: skip
    return {
        "requests": num_requests,
        "distinct_queries": len(found),
        "with_candidate": sum(c is not None for c in found.values()),
        "floor": floor,
        "verify_fraction": verify_fraction,
        "min_verifications": min_verifications,
        "runs": runs,
    }


def plot_traffic(result: dict[str, Any], path: Any) -> Any:
    """Hit rate against realized error: fixed thresholds (a curve per seed) and the error
    budget (a point per max_error_rate and seed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for index, run in enumerate(result["runs"]):
        fixed = run["fixed"]
        axes.plot([r["error_rate"] for r in fixed], [r["hit_rate"] for r in fixed],
                  color="tab:gray", alpha=0.7, marker=".",
                  label="fixed threshold + guards" if index == 0 else None)  # fmt: skip
        for position, row in enumerate(run["budget"]):
            label = "error budget" if index == 0 and position == 0 else None
            axes.scatter(row["error_rate"], row["hit_rate"], color="tab:blue", label=label)
            axes.annotate(f"δ={row['max_error_rate']:g}", (row["error_rate"], row["hit_rate"]),
                          textcoords="offset points", xytext=(4, 4), fontsize="small")  # fmt: skip
    axes.set(xlabel="realized error (wrong answers / semantic hits served)",
             ylabel="semantic hit rate (hits / requests)", xscale="symlog",
             title=f"{result['requests']:,} simulated requests per seed")  # fmt: skip
    axes.set_xscale("symlog", linthresh=0.01)
    axes.legend(loc="lower right")
    figure.savefig(path, dpi=120)
    return path
