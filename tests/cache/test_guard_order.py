"""The structural guards: values reordered, sides of a relation swapped, one against all. Cases
written for the kinds, none taken from a labeled set."""

from __future__ import annotations

import pytest

from titan.cache.guards import refusal

SWAPPED = [
    ("Is a cheetah faster than a horse?", "Is a horse faster than a cheetah?"),
    ("What is 12 minus 30?", "What is 30 minus 12?"),
    ("Convert Markdown to HTML with pandoc", "Convert HTML to Markdown with pandoc"),
    ("Was Mozart born before Beethoven?", "Was Beethoven born before Mozart?"),
    ("Is Berlin east of Prague?", "Is Prague east of Berlin?"),
    ("Should I use vim instead of emacs?", "Should I use emacs instead of vim?"),
    ("Average of 4, 9 and 20 weighted by 1, 2 and 3", "Average of 4, 9 and 20 weighted by 3, 2, 1"),
    ("What's 2 to the power of 8?", "What's 8 to the power of 2?"),
]
SCOPE = [
    ("How do I delete a branch in git?", "How do I delete all branches in git?"),
    ("How do I close a tab in Chrome?", "How do I close every tab in Chrome?"),
]
KEPT = [
    ("In Python, how do I reverse a list?", "How do I reverse a list in Python?"),
    ("What's the difference between TCP and UDP?", "What's the difference between UDP and TCP?"),
    ("python list sort", "How do I sort a list in Python?"),
    ("Should I learn Rust or Go first?", "Should I learn Go or Rust first?"),
    ("How long does it take to boil an egg?", "To boil an egg, how long does it take?"),
    (
        "What's the best way for an adult to learn to swim?",
        "What is the best way to learn to swim as an adult?",
    ),
]


@pytest.mark.parametrize(("query", "cached"), SWAPPED)
def test_swapped_sides_and_reordered_values_are_refused(query, cached):
    assert refusal(query, cached) == "order"
    assert refusal(cached, query) == "order"


@pytest.mark.parametrize(("query", "cached"), SCOPE)
def test_all_against_one_is_refused(query, cached):
    assert refusal(query, cached) == "scope"


@pytest.mark.parametrize(("query", "cached"), KEPT)
def test_moved_phrases_symmetric_pairs_and_keywords_pass(query, cached):
    assert refusal(query, cached) is None
