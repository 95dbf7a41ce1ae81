"""The reranking step of a vector store search, and OpenAI's ``ranking_options``.

Embedding similarity finds passages about the right topic but is weak on the exact words that
decide between them (a name, a number, a product code). The reranker takes a wider set of
candidates from the index and blends each one's cosine score with a BM25 score of the query's
words in its text (computed over the candidates), the hybrid scheme retrieval systems use, with
no second model to load. ``ranker: "none"`` keeps the plain vector order.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from titan.errors import InvalidRequestError

RANKERS = ("auto", "default-2024-11-15", "none")
# Share of the final score that comes from the words; the rest is the embedding's cosine.
LEXICAL_WEIGHT = 0.3
# Candidates the reranker sees per result asked for (at least MIN_CANDIDATES).
CANDIDATES_PER_RESULT = 4
MIN_CANDIDATES = 20
BM25_K1 = 1.2
BM25_B = 0.75
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class RankingOptions:
    rerank: bool = True
    score_threshold: float = 0.0

    def candidates(self, k: int) -> int:
        return max(k * CANDIDATES_PER_RESULT, MIN_CANDIDATES) if self.rerank else k


def ranking_options(asked: Any, param: str = "ranking_options") -> RankingOptions:
    if asked is None:
        return RankingOptions()
    if not isinstance(asked, dict):
        raise InvalidRequestError(
            f"'{param}' must be an object like {{'ranker': 'auto', 'score_threshold': 0.5}}.",
            param=param,
        )
    ranker = asked.get("ranker", "auto")
    if ranker not in RANKERS:
        raise InvalidRequestError(
            f"Invalid '{param}.ranker' {ranker!r}: use one of {', '.join(RANKERS)}.",
            param=f"{param}.ranker",
        )
    threshold = asked.get("score_threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        threshold = -1
    if not 0 <= threshold <= 1:
        raise InvalidRequestError(
            f"'{param}.score_threshold' must be a number between 0 and 1.",
            param=f"{param}.score_threshold",
        )
    return RankingOptions(rerank=ranker != "none", score_threshold=float(threshold))


def words(text: str) -> list[str]:
    return [word.lower() for word in _WORD.findall(text)]


def bm25(query: str, texts: Sequence[str]) -> list[float]:
    """Okapi BM25 of the query's words in each text, document frequencies over ``texts``."""
    documents = [Counter(words(text)) for text in texts]
    if not documents:
        return []
    lengths = [sum(counts.values()) for counts in documents]
    average = sum(lengths) / len(lengths) or 1.0
    scores = [0.0] * len(documents)
    for term in set(words(query)):
        having = sum(1 for counts in documents if term in counts)
        if not having:
            continue
        idf = math.log(1 + (len(documents) - having + 0.5) / (having + 0.5))
        for i, counts in enumerate(documents):
            frequency = counts.get(term, 0)
            if frequency:
                norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths[i] / average)
                scores[i] += idf * frequency * (BM25_K1 + 1) / (frequency + norm)
    return scores


def rerank(query: str, texts: Sequence[str], cosines: Sequence[float]) -> list[float]:
    """Blended scores in [0, 1] for the candidates ``texts`` with their cosine scores."""
    lexical = bm25(query, texts)
    best = max(lexical, default=0.0) or 1.0
    return [
        (1 - LEXICAL_WEIGHT) * max(0.0, cosine) + LEXICAL_WEIGHT * score / best
        for cosine, score in zip(cosines, lexical, strict=True)
    ]
