"""The pair verifier's fit (benchmarks/fit_pair_verifier.py): weights kept >= 0, threshold by
the share of near misses it would accept."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fit_pair_verifier import choose_threshold, fit_logistic, main
from titan.cache import pair_verifier


def test_a_feature_that_would_get_a_negative_weight_is_dropped():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 2))
    y = (x[:, 0] - x[:, 1] + 0.3 * rng.standard_normal(400)) > 0  # the second counts against
    weights, _ = fit_logistic(x, y)
    assert weights[0] > 1 and weights[1] == 0.0
    free = np.linalg.lstsq(np.c_[x, np.ones(400)], y - 0.5, rcond=None)[0]
    assert free[1] < 0  # unconstrained, it would have been negative


def test_the_threshold_admits_at_most_the_allowed_share_of_near_misses():
    p = np.array([0.99, 0.97, 0.95, 0.9, 0.5, 0.2])
    y = np.array([True, False, False, True, False, False])
    cosine = np.array([0.95, 0.95, 0.7, 0.9, 0.9, 0.9])
    # Near misses at or above the floor: 0.97, 0.5 and 0.2 (0.95 is under it). Of 400 near
    # misses 0.5% (2) may be accepted: the threshold sits just above the third.
    threshold = choose_threshold(p, y, cosine, floor=0.8, num_near_misses=400)
    assert 0.2 < threshold <= 0.2 + 1e-5
    assert 0.5 < choose_threshold(p, y, cosine, floor=0.8, num_near_misses=200) <= 0.5 + 1e-5
    assert choose_threshold(p, y, cosine, floor=0.8, num_near_misses=1000) == 0.0


@pytest.mark.slow
def test_the_shipped_constants_are_what_the_training_sets_give(capsys):
    # Refit from the training pairs with the real embedder: the constants in pair_verifier.py
    # come from them and nothing else (a held-out set joining the fit would change them).
    main()
    printed = dict(
        line.split(" = ", 1) for line in capsys.readouterr().out.splitlines() if " = " in line
    )
    for name in ("MEAN", "SCALE", "WEIGHTS"):
        fitted = np.array(printed[name].removeprefix("np.array([").removesuffix("])").split(", "),
                          dtype=float)  # fmt: skip
        assert np.allclose(fitted, getattr(pair_verifier, name), rtol=1e-3, atol=1e-3), name
    assert abs(float(printed["BIAS"]) - pair_verifier.BIAS) < 1e-3
    assert abs(float(printed["THRESHOLD"]) - pair_verifier.THRESHOLD) < 2e-3
