"""The semantic cache's pair verifier: would the answer cached for one question answer another?

Cosine similarity of two sentence vectors cannot tell a poem from an essay about the same
subject, or one relation of a thing from another: the guards (guards.py) catch the lexical signs
they know and miss what they were not written for. The verifier looks at the two questions token
by token, as BERTScore does: each content token of one is matched to its closest token of the
other, by the model's contextual token vectors (the states mean pooling averages) and by its
input embeddings; a token with no close counterpart is a changed task, relation, entity or unit.
With the cosine and the content-word overlap these make 14 measures of likeness, combined by a
logistic regression with non-negative weights, fit on the *training* pair sets only, on the
pairs the guards let through (``python -m benchmarks.fit_pair_verifier`` prints the constants
below). A pair is accepted when its probability reaches ``THRESHOLD``, chosen there by 5-fold
cross-validation. The held-out sets are never fit on (bench/RESULTS.md reports them apart).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from titan.cache import guard_words as w
from titan.cache.guards import Analysis

NUM_FEATURES = 2 + 6 + 6


@dataclass(frozen=True)
class TokenVectors:
    """One question's content tokens (word pieces that are not function words) as unit vectors:
    ``contextual`` from the model's last layer, ``static`` from its input embedding table."""

    contextual: np.ndarray  # float32 [tokens, dim]
    static: np.ndarray  # float32 [tokens, dim]


def is_content_piece(piece: str) -> bool:
    """A word piece the alignment counts: a continuation ("##ing"), or an alphanumeric piece
    that is not a function word."""
    return piece.startswith("##") or (piece.isalnum() and piece.lower() not in w.FUNCTION_WORDS)


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.maximum(norms, 1e-9)).astype(np.float32)


def token_vectors(pieces: list[str], contextual: np.ndarray, table: np.ndarray, ids: list[int]):
    """TokenVectors of one question from its pieces (no special tokens), their last-layer states
    and the input embedding table; every piece when none is a content piece."""
    keep = [i for i, piece in enumerate(pieces) if is_content_piece(piece)] or list(
        range(len(pieces))
    )
    chosen_ids = np.asarray(ids, dtype=np.int64)[keep]
    return TokenVectors(unit_rows(contextual[keep]), unit_rows(table[chosen_ids]))


def _alignment(one: np.ndarray, other: np.ndarray) -> list[float]:
    """Each token's best match in the other text, both ways: means, minimums, and the mean of
    the two worst (a single unmatched word is what a near miss often is)."""
    if not len(one) or not len(other):
        return [0.0] * 6
    similarity = one @ other.T
    forward, backward = similarity.max(1), similarity.max(0)
    return [
        float(forward.mean()), float(backward.mean()),
        float(forward.min()), float(backward.min()),
        float(np.sort(forward)[:2].mean()), float(np.sort(backward)[:2].mean()),
    ]  # fmt: skip


def features(
    cosine: float,
    cached: Analysis,
    query: Analysis,
    cached_tokens: TokenVectors,
    query_tokens: TokenVectors,
) -> np.ndarray:
    """Only measures of likeness (each weighted >= 0 by the fit): the more alike two questions
    are by every measure, the likelier they are accepted, so a question reworded by a word or
    two is never refused for being too close. Counts of changed words were tried and dropped:
    the fit learnt from the labeled sets that near misses change few words and paraphrases
    many, and refused "How can I reset my password?" against "How do I reset my password?"."""
    content_cached = cached.stems - w.FUNCTION_WORDS
    content_query = query.stems - w.FUNCTION_WORDS
    union = content_cached | content_query
    values = [
        cosine,
        len(content_cached & content_query) / len(union) if union else 1.0,
        *_alignment(cached_tokens.contextual, query_tokens.contextual),
        *_alignment(cached_tokens.static, query_tokens.static),
    ]
    return np.asarray(values, dtype=np.float64)


# Fit by benchmarks/fit_pair_verifier.py on the project's and the calibration pairs (the training
# sets), with the quantized MiniLM: standardization, then the logistic regression's weights.
MEAN = np.array([
    0.853354, 0.465337, 0.829469, 0.769817, 0.606261, 0.469312, 0.707046, 0.575602, 0.759742,
    0.663634, 0.367215, 0.180859, 0.539343, 0.33396
])  # fmt: skip
SCALE = np.array([
    0.120389, 0.219275, 0.13081, 0.13268, 0.252549, 0.213555, 0.210093, 0.207937, 0.173377,
    0.166458, 0.32537, 0.203583, 0.296838, 0.256075
])  # fmt: skip
WEIGHTS = np.array([
    0.342028, 0, 0, 0, 1.39506, 0.957085, 0, 0, 0, 0, 0, 0, 0, 0
])  # fmt: skip
BIAS = 2.16292
THRESHOLD = 0.9623


def probability(values: np.ndarray) -> float:
    """The fitted probability that the two questions share their right answer."""
    z = float(((values - MEAN) / SCALE) @ WEIGHTS + BIAS)
    return 1.0 / (1.0 + np.exp(-z)) if z > -500 else 0.0


def accepts(values: np.ndarray, threshold: float = THRESHOLD) -> bool:
    return probability(values) >= threshold


def refusal(
    cosine: float,
    cached: Analysis,
    query: Analysis,
    cached_tokens: TokenVectors,
    query_tokens: TokenVectors,
) -> str | None:
    """As the guards say it: None, or "verifier" when the verifier refuses the pair."""
    values = features(cosine, cached, query, cached_tokens, query_tokens)
    return None if accepts(values) else "verifier"
