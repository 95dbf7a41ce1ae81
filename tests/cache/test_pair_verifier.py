"""The pair verifier's features and its fitted constants (titan/cache/pair_verifier.py)."""

from __future__ import annotations

import numpy as np

from titan.cache import pair_verifier
from titan.cache.guards import analyze
from titan.cache.pair_verifier import TokenVectors


def tokens(*rows: list[float]) -> TokenVectors:
    matrix = pair_verifier.unit_rows(np.array(rows, dtype=np.float32))
    return TokenVectors(matrix, matrix)


def test_the_fitted_constants_only_reward_likeness():
    # Every feature is a measure of likeness: with weights >= 0, a pair more alike by any of
    # them is never less likely accepted (a small rewording is never refused for it).
    for constant in (pair_verifier.MEAN, pair_verifier.SCALE, pair_verifier.WEIGHTS):
        assert constant.shape == (pair_verifier.NUM_FEATURES,)
    assert (pair_verifier.WEIGHTS >= 0).all() and (pair_verifier.SCALE > 0).all()
    assert 0 < pair_verifier.THRESHOLD < 1
    base = pair_verifier.MEAN.copy()
    for index in range(pair_verifier.NUM_FEATURES):
        raised = base.copy()
        raised[index] += pair_verifier.SCALE[index]
        assert pair_verifier.probability(raised) >= pair_verifier.probability(base)


def test_a_question_against_itself_is_accepted_and_an_unmatched_token_lowers_it():
    question = analyze("How do I reverse a list in Python?")
    same = tokens([1, 0, 0], [0, 1, 0], [0, 0, 1])
    values = pair_verifier.features(1.0, question, question, same, same)
    assert values[1] == 1.0 and np.allclose(values[2:], 1.0)
    assert pair_verifier.accepts(values)
    other = tokens([1, 0, 0], [0, 1, 0], [0.1, 0.2, -1])  # the third token is matched by nothing
    changed = pair_verifier.features(1.0, question, question, same, other)
    assert changed[4] < 0.5 and changed[5] < 0.5  # the worst-matched token, both ways
    assert pair_verifier.probability(changed) < pair_verifier.probability(values)


def test_content_pieces_leave_out_function_words_and_punctuation():
    pieces = ["how", "do", "i", "reverse", "a", "list", "in", "python", "?", "##s"]
    assert [p for p in pieces if pair_verifier.is_content_piece(p)] == [
        "reverse", "list", "python", "##s",
    ]  # fmt: skip
    kept = pair_verifier.token_vectors(["the", "?"], np.eye(2, 3), np.eye(4, 3), [0, 1])
    assert kept.contextual.shape == (2, 3)  # no content piece: every piece counts
