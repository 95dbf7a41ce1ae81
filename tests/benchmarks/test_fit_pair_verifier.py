"""The pair verifier's threshold choice (benchmarks/fit_pair_verifier.py): groups of training
sources left out in turn, and the threshold by the share of left-out near misses it admits."""

from __future__ import annotations

import numpy as np

from benchmarks.fit_pair_verifier import FALSE_SHARE, choose_threshold, folds, sources


def test_every_source_is_left_out_exactly_once():
    names = ["b", "a", "f", "c", "e", "d", "g"]
    groups = folds(names, 3)
    assert len(groups) == 3 and all(groups)
    assert sorted(name for group in groups for name in group) == sorted(names)


def test_the_training_sources_are_files_of_pairs():
    found = sources()
    assert len(found) >= 3 and len(folds(list(found))) == 3
    assert not any("heldout" in name for name in found)


def test_the_threshold_admits_at_most_the_allowed_share_of_near_misses():
    rng = np.random.default_rng(0)
    near_misses = rng.uniform(0, 1, 1000)
    paraphrases = rng.uniform(0.5, 1, 300)
    scores = np.concatenate([near_misses, paraphrases])
    labels = np.array([False] * 1000 + [True] * 300)
    threshold = choose_threshold(scores, labels)
    admitted = (near_misses >= threshold).sum()
    assert admitted <= FALSE_SHARE * 1000
    # The lowest such threshold: one step lower admits one more.
    below = np.sort(near_misses)[::-1][int(FALSE_SHARE * 1000)]
    assert below < threshold and (near_misses >= below).sum() == admitted + 1
