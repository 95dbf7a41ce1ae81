"""Guards on the structure of two questions that share their words: the same values in another
order, two sides of a relation swapped, one thing against all of them.

Sentence embeddings are nearly blind to word order: "Is Python faster than C?" and "Is C faster
than Python?" score 0.99, as do "17 minus 9" and "9 minus 17"; on an independently written
labeled set, such pairs were most of the wrong hits that passed the word-level guards.

- ``values_reordered``: the same numbers in another order ("range(2, 10, 3)" vs "range(3, 10,
  2)", "3/8" vs "8/3").
- ``sides_swapped``: two words that change places around words both texts keep between them
  ("A faster than B" vs "B faster than A", "A to B" vs "B to A", "A minus B"). Moving a phrase
  elsewhere ("In Python, how do I X?" vs "How do I X in Python?") keeps nothing between the two
  words, and a symmetric conjunction ("A and B", "A or B", "A vs B") is no evidence.
- ``scope_differs``: one asks about all, every, each or the whole of something, the other does
  not ("mute a participant" vs "mute all participants").
"""

from __future__ import annotations

from itertools import combinations

from titan.cache import guard_words as w

# Words that relate what stands on their two sides (prepositions, comparisons, operators): one
# that both texts keep between two swapped words makes the swap a change of meaning. Without
# one, the texts are keyword lists ("python list sort" vs "sort list python") or symmetric ("A
# and B", "A or B", "A vs B").
_RELATIONS = w.words(
    "to than of from into onto in on at by for with as before after instead minus plus over "
    "under above below ahead behind times divided per"
)
UNIVERSAL = w.words("all every each entire whole both")
# Pairs compared at most: each text's first distinct words (sentence-length questions).
_MAX_WORDS = 40


def _values(words: tuple[str, ...]) -> list[str]:
    return [word for word in words if word[0].isdigit()]


def values_reordered(one: tuple[str, ...], other: tuple[str, ...]) -> bool:
    first, second = _values(one), _values(other)
    return first != second and sorted(first) == sorted(second)


def _first_positions(words: tuple[str, ...]) -> dict[str, int]:
    positions: dict[str, int] = {}
    for index, word in enumerate(words[:_MAX_WORDS]):
        positions.setdefault(word, index)
    return positions


def _kept(words: tuple[str, ...]) -> frozenset[str]:
    return frozenset(words) - w.DETERMINERS


def sides_swapped(one: tuple[str, ...], other: tuple[str, ...]) -> bool:
    here, there = _first_positions(one), _first_positions(other)
    shared = [word for word in here if word in there and word not in w.FUNCTION_WORDS]
    for a, b in combinations(shared, 2):
        if (here[a] - here[b]) * (there[a] - there[b]) >= 0:
            continue  # the same order in both
        low, high = sorted((here[a], here[b]))
        between = _kept(one[low + 1 : high])
        low, high = sorted((there[a], there[b]))
        between_there = _kept(other[low + 1 : high])
        common = between & between_there
        # Mostly the same words between them (a side of several words may add one), and a
        # relation among them.
        if 2 * len(common) >= len(between | between_there) and not _RELATIONS.isdisjoint(common):
            return True
    return False


def scope_differs(one: tuple[str, ...], other: tuple[str, ...]) -> bool:
    return UNIVERSAL.isdisjoint(one) != UNIVERSAL.isdisjoint(other)
