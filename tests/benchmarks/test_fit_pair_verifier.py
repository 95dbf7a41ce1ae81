"""The pair verifier's threshold choice (benchmarks/fit_pair_verifier.py): groups of training
sources left out in turn, and the threshold by the share of left-out near misses it admits."""

from __future__ import annotations

import numpy as np

from benchmarks.fit_pair_verifier import (
    FALSE_SHARE,
    FLOORS,
    choose_floor,
    choose_threshold,
    folds,
    sources,
)


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


def test_the_floor_serves_the_most_paraphrases_within_the_same_near_miss_share():
    rng = np.random.default_rng(1)
    # Paraphrases spread over cosines 0.5-1, the verifier sure of them; near misses under 0.7
    # that the verifier would pass: a floor of 0.7 keeps them out and loses fewer paraphrases.
    paraphrase_cosines = rng.uniform(0.5, 1.0, 400)
    miss_cosines = np.concatenate([rng.uniform(0.6, 0.7, 100), rng.uniform(0.7, 1.0, 900)])
    miss_scores = np.concatenate([rng.uniform(0.97, 1.0, 100), rng.uniform(0.0, 0.9, 900)])
    cosines = np.concatenate([paraphrase_cosines, miss_cosines])
    scores = np.concatenate([rng.uniform(0.95, 1.0, 400), miss_scores])
    labels = np.array([True] * 400 + [False] * 1000)
    rows = choose_floor(cosines, scores, labels)
    assert sorted(row[0] for row in rows) == sorted(FLOORS)
    best = rows[0]
    assert best[0] == 0.7 and best[3] <= FALSE_SHARE
    assert all(best[2] >= row[2] for row in rows)
    # Without those near misses the lowest floor serves the most.
    quiet = np.where(cosines < 0.7, np.where(labels, scores, 0.0), scores)
    assert choose_floor(cosines, quiet, labels)[0][0] == min(FLOORS)
