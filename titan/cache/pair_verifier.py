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
which at most 0.5% of the left-out near misses pass, 0.99787 on 2026-12-06 over seventeen
sources' 6,753 pairs: paraphrases 54.3% and near misses 0.5% over the left-out pairs, at the
cache's floor of 0.6, which served more of them than any other floor of 0.6-0.8); the held-out
sets are never used to choose anything.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from titan.cache.minilm import QuantizedMiniLM
from titan.cache.pair_training import HEAD

THRESHOLD = 0.99787
# Guards whose reasons the verifier judges instead, when it runs: on the left-out writers'
# pairs, with these two left to it, 4-8 points more paraphrases were served at the same share
# of near misses, in each of the three folds of two fits (13 and 17 sources). A brand for the
# generic name, an entity's initials, "avoid X" for "don't X" are paraphrases the rules
# refuse; a different entity or a negation is a near miss the verifier does not serve.
JUDGED_BY_VERIFIER = frozenset({"negation", "entities"})


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
        logits = self._model.pair_states(pairs) @ self._weight + self._bias
        return [_sigmoid(float(logit)) for logit in logits]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
