"""The semantic cache's pair verifier: would the answer cached for one question answer another?

Cosine similarity of two sentence vectors cannot tell a poem from an essay about the same
subject, 7 - 3 from 3 - 7, or one relation of a thing from another: near misses of every kind
score as high as paraphrases (on the held-out pairs, two thirds of the near misses reach 0.8).
A cross-encoder reads the two questions together, every token of one attending to every token
of the other, and says whether they ask the same thing. This one is all-MiniLM-L6-v2 fine-tuned
on the training pairs (pair_training.py), run on the CPU kernels as the embedder is
(minilm.py). A candidate that the guards let through is served only when the verifier's
probability that the two questions ask the same reaches ``THRESHOLD``.

The threshold was chosen on the training pairs alone (``python -m benchmarks.fit_pair_verifier``:
three models, each trained with a group of writers' files left out; the lowest threshold at
which at most 0.5% of the left-out near misses pass, 0.99732 on 2026-12-06 over twenty-seven
sources' 10,753 pairs, each pair read both ways: paraphrases 64.0% and near misses 0.5% over the
left-out pairs, at the cache's floor of 0.65: as many as at 0.5, to a tenth of a point, more
than at 0.55-0.8). Held-out sets are never used to choose a value
(docs/caching.md says which sets saw which version).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from titan.cache.minilm import QuantizedMiniLM
from titan.cache.pair_training import HEAD

THRESHOLD = 0.99732
# Guards whose reasons the verifier judges instead, when it runs: on the left-out writers'
# pairs, each of these left to it served more paraphrases at the same share of near misses, in
# each of the three folds (negation and entities: +4-8 points in two fits of 13 and 17
# sources; numbers and scope: +4.9-7.1 points together in the fit of 22 sources, with no more
# number-kind near misses served). A brand for the generic name, "avoid X" for "don't X", "my
# 5 year old" added as context, "all the files" for "the files" are paraphrases the rules
# refuse; a different entity, a negation or another number is a near miss the verifier
# does not serve.
JUDGED_BY_VERIFIER = frozenset({"negation", "entities", "numbers", "scope"})


class PairVerifier:
    """``probabilities`` of (cached question, new question) pairs asking the same thing."""

    def __init__(self, model: QuantizedMiniLM, weight: np.ndarray, bias: float):
        self._model = model
        self._weight = weight.astype(np.float32)
        self._bias = float(bias)

    @classmethod
    def load(cls, base_dir: Path, weights_file: Path, kernels: Any) -> PairVerifier:
        from safetensors.numpy import load_file

        weights = load_file(str(weights_file))
        model = QuantizedMiniLM.load(base_dir, kernels, weights)
        return cls(model, weights[f"{HEAD}.weight"], float(weights[f"{HEAD}.bias"][0]))

    def probabilities(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Each pair read in both orders (one batch), the lower of the two: a near miss the
        model is sure of one way round is often doubted the other way (on the left-out
        writers' pairs, +2.3 to +5.0 points of paraphrases served at the same share of near
        misses, fold by fold, for twice the rows of a forward)."""
        both = [*pairs, *((second, first) for first, second in pairs)]
        logits = self._logits(both)
        lower = np.minimum(logits[: len(pairs)], logits[len(pairs) :])
        return [_sigmoid(float(logit)) for logit in lower]

    def probability(self, cached: str, asked: str) -> float:
        """One pair's, as ``probabilities`` gives it when it reaches ``THRESHOLD``; below, the
        first order's alone, for the same verdict: the second order is read only when the
        first reaches the threshold (the lower of two is below it when one is). A forward
        costs its rows, so a refusal takes half the time of both orders in one batch, and a
        pair served ~4% more (one order 3.1 ms p50, both 6.0, one then the other 6.2, on
        AVX2 kernels built -march=haswell on a Xeon, 2 threads)."""
        logit = float(self._logits([(cached, asked)])[0])
        if _sigmoid(logit) >= THRESHOLD:
            logit = min(logit, float(self._logits([(asked, cached)])[0]))
        return _sigmoid(logit)

    def _logits(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        return self._model.pair_states(pairs) @ self._weight + self._bias


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
