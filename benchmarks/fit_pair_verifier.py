"""Fit the semantic cache's pair verifier (titan/cache/pair_verifier.py) on the training pair
sets, the project's and the calibration pairs, and print its constants; never on a held-out set.

    python -m benchmarks.fit_pair_verifier

Only the pairs the guards let through are fit on (the verifier never sees the others). A
logistic regression (L2, C = 1) on standardized features, fit by Newton's method, with every
weight >= 0: a feature whose weight comes out negative is dropped (weight 0) and the rest refit,
so that more alike is never less likely accepted. The acceptance threshold is chosen by 5-fold
cross-validation on the same sets: the lowest at which at most ``FALSE_SHARE`` of all the near
misses (guarded ones included) would be accepted at the default floor (``min_similarity``),
half the default error budget.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from benchmarks import cache_eval
from benchmarks.cache_quality import SETS, TESTS_DATA, TRAINING
from titan.cache import guards, pair_verifier
from titan.cache.embedder import Embedder
from titan.config.cache import SemanticCacheConfig

FALSE_SHARE = 0.005
FOLDS = 5


def pair_features(
    pairs: Sequence[cache_eval.Pair], embedder: Embedder
) -> tuple[np.ndarray, np.ndarray]:
    """The verifier's features of every pair, with the embedder the server uses, and whether
    the guards let the pair through."""
    texts = sorted({str(pair[side]) for pair in pairs for side in ("cached", "query")})
    vectors = dict(zip(texts, np.asarray(embedder.encode(texts), dtype=np.float32), strict=True))
    tokens = dict(zip(texts, embedder.encode_tokens(texts), strict=True))
    rows, passed = [], []
    for pair in pairs:
        cached, query = str(pair["cached"]), str(pair["query"])
        cached_analysis, query_analysis = guards.analyze(cached), guards.analyze(query)
        rows.append(pair_verifier.features(
            float(vectors[cached] @ vectors[query]), cached_analysis, query_analysis,
            tokens[cached], tokens[query],
        ))  # fmt: skip
        passed.append(guards.refusal(query_analysis, cached_analysis) is None)
    return np.asarray(rows), np.asarray(passed)


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float = 1.0) -> tuple[np.ndarray, float]:
    """Weights (>= 0) and bias minimizing sum(log loss) + |w|^2 / (2c), the bias not penalized:
    Newton's method on the features still in, dropping any whose weight comes out negative."""
    kept = np.ones(x.shape[1], dtype=bool)
    while True:
        weights, bias = _newton(x[:, kept], y, c)
        if (weights >= 0).all():
            full = np.zeros(x.shape[1])
            full[kept] = weights
            return full, bias
        kept[np.flatnonzero(kept)[weights < 0]] = False


def _newton(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    design = np.hstack([x, np.ones((len(x), 1))])
    theta = np.zeros(design.shape[1])
    penalty = np.eye(design.shape[1]) / c
    penalty[-1, -1] = 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        gradient = design.T @ (p - y) + penalty @ theta
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + penalty + 1e-9 * np.eye(len(theta))
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return theta[:-1], float(theta[-1])


def standardize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x.mean(0), np.where(x.std(0) > 0, x.std(0), 1.0)


def probabilities(x: np.ndarray, mean, scale, weights, bias) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(((x - mean) / scale) @ weights + bias)))


def cross_validated(x: np.ndarray, y: np.ndarray, seed: int = 0) -> np.ndarray:
    order = list(range(len(x)))
    random.Random(seed).shuffle(order)
    out = np.zeros(len(x))
    for fold in range(FOLDS):
        test = np.array(order[fold::FOLDS])
        train = np.setdiff1d(np.arange(len(x)), test)
        mean, scale = standardize(x[train])
        weights, bias = fit_logistic((x[train] - mean) / scale, y[train])
        out[test] = probabilities(x[test], mean, scale, weights, bias)
    return out


def choose_threshold(p: np.ndarray, y: np.ndarray, cosine: np.ndarray, floor: float,
                     num_near_misses: int) -> float:  # fmt: skip
    """The lowest probability at which at most FALSE_SHARE of all the near misses would be
    accepted (of those the guards let through, at or above the floor)."""
    candidates = np.sort(p[(~y) & (cosine >= floor)])[::-1]
    allowed = int(FALSE_SHARE * num_near_misses)
    return float(candidates[allowed] + 1e-6) if allowed < len(candidates) else 0.0


def main() -> None:
    pairs = [p for name in TRAINING for p in cache_eval.load_pairs(TESTS_DATA / SETS[name])]
    embedder = Embedder.load()
    every_x, passed = pair_features(pairs, embedder)
    every_y = np.array([bool(pair["should_hit"]) for pair in pairs])
    x, y = every_x[passed], every_y[passed]
    floor = SemanticCacheConfig().min_similarity
    near_misses = int((~every_y).sum())
    threshold = choose_threshold(cross_validated(x, y), y, x[:, 0], floor, near_misses)
    mean, scale = standardize(x)
    weights, bias = fit_logistic((x - mean) / scale, y)
    accepted = (probabilities(x, mean, scale, weights, bias) >= threshold) & (x[:, 0] >= floor)
    print(f"# {len(pairs)} training pairs ({int(every_y.sum())} paraphrases), {len(x)} past the "
          f"guards; {embedder.kind}")  # fmt: skip
    print(f"# in-sample at the threshold and the floor: {int((accepted & y).sum())} paraphrases, "
          f"{int((accepted & ~y).sum())} near misses accepted")  # fmt: skip
    for name, values in (("MEAN", mean), ("SCALE", scale), ("WEIGHTS", weights)):
        print(f"{name} = np.array([{', '.join(f'{v:.6g}' for v in values)}])")
    print(f"BIAS = {bias:.6g}")
    print(f"THRESHOLD = {threshold:.4f}")


if __name__ == "__main__":
    main()
