"""Guards against false semantic-cache hits.

Sentence embeddings place "How do I install numpy?" and "How do I uninstall numpy?" (or "...in
Python 3.8" and "...in Python 3.12") very close together, so a similarity threshold alone serves
wrong answers. `refusal` looks for the cheap lexical signs of a different question and names the
first one found. A refusal only costs a cache hit (the request goes to the model), a missed one
serves a wrong answer: when in doubt the rules refuse.

Decisions worth knowing:
- Negations are counted, not just detected: "can't" and "cannot" are one each (no refusal); "not
  ... never" against "not" is refused. "avoid X", "prevent X" and "stop X-ing" count as one.
- Number words are normalized to digits ("two" == "2", "twenty-five" == "25", "first" == "1st",
  "fifty percent" == "50%", "twice" == "2"), but a cardinal never equals an ordinal ("2" != "2nd").
  "one" is not counted: it mostly means "a" ("one cup" == "a cup"). Versions compare as written:
  "3.8" != "3.12". A unit after a number is part of it ("5 km" != "5 miles"), and measurement
  units are compared anywhere ("ounces in a pound" != "grams in a pound").
- An entity of one text matches when the other contains it as a word in any case, also split or
  joined ("GPT-4" == "gpt 4" == "GPT4"), with a plural or demonym ending ("Africa" ~ "African"), or
  by a known alias ("k8s" == "Kubernetes", "US" == "United States"). A capitalized word starting
  a sentence is an entity only when it is not a common sentence opener ("What", "Explain").
- Antonyms refuse only when one text has the word and not its antonym while the other has the
  antonym and not the word: "before or after" mentions both and proves nothing. Opposites made
  with a prefix ("block/unblock", "toxic/non-toxic") and verb particles ("zoom in/out") count.

Reasons beyond single words: "order" (the same two things on either side of "to", "into",
"from": "convert A to B" vs "convert B to A"; "from A to B" == "to B from A"; and, from
`guard_order`, the same values in another order or two sides of a relation swapped), "scope"
(all of something against one) and "question" (both ask for a specific kind of answer, but
different ones: "When was it built?" vs "How tall is it?"; "what" and "how do I" are not
specific).

Everything is built at import from the constant tables of `guard_words` (no mutable state). A
call costs ~30-70 µs for two sentence-length texts on a 2-core EPYC, most of it analyzing them:
pass `analyze(cached)` computed once at insert to halve it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from types import MappingProxyType

from titan.cache import guard_words as w
from titan.cache.guard_order import scope_differs, sides_swapped, values_reordered

# Words, numbers, versions and contractions as single tokens: "can't", "3.12", "GPT-4", "U.S".
_TOKEN = re.compile(r"[^\W_]+(?:['.\-&+][^\W_]+)*")
# Sentence ends (":" too: "Question: What ..."); the space keeps "3.12" and "e.g" whole.
_SENTENCES = re.compile(r"[.!?:;]+(?:\s|$)|\n")
_DIGIT = re.compile(r"\d")
_APOSTROPHES = re.compile(r"[’‘`´]")
# Thousands groups, decimals, versions, times. It starts with a digit (no lookbehind) so that the
# regex engine can skip to digits: 5x faster than with one.
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:[.:]\d+)*")
_NUMBER_SUFFIX = re.compile(r"[\s-]?(%|[a-z]+(?:\.[a-z])?\b)", re.IGNORECASE)
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|(?<!\w)'([^']+)'(?!\w)")
_LETTER_THEN_DIGIT = re.compile(r"[^\W\d_]\d")
_CAMEL = re.compile(r"[a-z][A-Z]")
_RUNS = re.compile(r"[^\W\d_]+|\d+")
_NON_ALNUM = re.compile(r"[\W_]+")
_CURRENCY = MappingProxyType({"$": "usd", "€": "eur", "£": "gbp", "¥": "jpy"})


_NONE: frozenset[tuple[str, str]] = frozenset()
# Function words never take part in an opposite: no need to stem them (half of all tokens).
_NO_STEM = w.FUNCTION_WORDS - frozenset(w.ANTONYMS) - frozenset(w.PARTICLES)
_NUMBER_VOCAB = frozenset(w.CARDINALS) | frozenset(w.SCALES) | frozenset(w.OTHER_NUMBER_WORDS)


@dataclass(frozen=True, slots=True)
class Analysis:
    """What the guards need to know about one text (`analyze`). Immutable: the cache can store
    it beside an entry and skip half of each check."""

    words: tuple[str, ...]  # lowercase tokens
    compacts: tuple[str, ...]  # the same, alphanumerics only, aliases resolved ("k8s" -> ...)
    negations: int
    numbers: tuple[str, ...]  # sorted: a multiset
    units: frozenset[str]
    entities: frozenset[str]  # compact forms
    quotes: tuple[str, ...]  # quoted phrases, lowercase tokens joined by spaces
    stems: frozenset[str]
    particles: frozenset[tuple[str, str]]  # (verb stem, particle): ("zoom", "in")
    question: frozenset[str]  # the kinds of answer asked for: "time", "quantity"...
    directions: frozenset[tuple[str, str]]  # ("usd", "eur") for "USD to EUR"


def _compact(token: str, lower: str) -> str:
    alias = w.CAPS_ALIASES.get(token)
    if alias:
        return alias
    if lower.endswith("'s"):  # "Python's" is "Python"
        lower = lower[:-2]
    compact = lower if lower.isalnum() else _NON_ALNUM.sub("", lower)
    return w.ALIASES.get(compact, compact)


def _numbers(text: str, words: tuple[str, ...]) -> tuple[str, ...]:
    """The numbers of `text` with their unit, if any, normalized ("2 kg" -> "2kg")."""
    found: list[str] = []
    for match in _NUMBER.finditer(text) if _DIGIT.search(text) else ():
        start, end = match.span()
        before, after = text[start - 1 : start], text[end : end + 1]
        if before.isalpha() and after.isalpha():
            continue  # a digit inside a name: "k8s", "i18n"
        # "-5" is negative when the minus stands alone, not in "GPT-4" or "3-5".
        sign = "-" if before == "-" and not text[start - 2 : start - 1].isalnum() else ""
        # "$50" == "50 dollars" == "50 USD".
        unit = _CURRENCY.get(before) or _unit(_NUMBER_SUFFIX.match(text, end))
        found.append(sign + match.group(0).replace(",", "") + unit)
    if not _NUMBER_VOCAB.isdisjoint(words) or any("-" in word for word in words):
        found += _word_numbers(words)
    return tuple(sorted(found))


def _word_numbers(words: tuple[str, ...]) -> list[str]:
    """Numbers written as words: "two hundred and five" -> 205, "ten-year-old" -> "10year"."""
    found: list[str] = []
    total = current = 0
    active = False  # inside a number ("twenty", "two hundred")
    for index, word in enumerate(words):
        before = words[index - 1] if index else ""
        if word in w.CARDINALS:
            value = w.CARDINALS[word]
            if current and not (current % 10 == 0 and current >= 20 and value < 10):
                found.append(str(total + current))  # "two three" are two numbers
                total = current = 0
            current, active = current + value, True
            continue
        if word in w.SCALES and (active or before == "a"):
            # "a hundred" is 100; "hundreds" (not in the table) stays a plain word.
            total, current, active = total + max(current, 1) * w.SCALES[word], 0, True
            continue
        if word == "and" and active and before in w.SCALES:
            continue  # "two hundred and five"
        if active:  # the number ends here; this word may be its unit
            found.append(str(total + current) + _unit_word(word))
            total = current = 0
            active = False
        parts = word.split("-") if "-" in word else ()
        if parts and parts[0] in w.CARDINALS:  # "twenty-five", "ten-year-old", "two-factor"
            value = w.CARDINALS[parts[0]]
            rest = parts[1:]
            if rest and rest[0] in w.CARDINALS and value >= 20:
                value, rest = value + w.CARDINALS[rest[0]], rest[1:]
            after = words[index + 1] if index + 1 < len(words) else ""
            found.append(str(value) + _unit_word(rest[0] if rest else after))
        elif word in w.OTHER_NUMBER_WORDS and not (
            word == "second" and (before in w.SECOND_AS_UNIT_AFTER or before.isdigit())
        ):
            found.append(w.OTHER_NUMBER_WORDS[word])
    if active:
        found.append(str(total + current))
    return found


def _unit_word(word: str) -> str:
    return (
        w.MEASURE_UNITS.get(word)
        or w.TIME_UNITS.get(word)
        or w.NUMBER_SUFFIXES.get(word)
        or w.CURRENCIES.get(word, "")
    )


def _unit(suffix: re.Match[str] | None) -> str:
    return _unit_word(suffix.group(1).lower()) if suffix else ""


def _is_entity(token: str, lower: str, initial: bool, shouting: bool) -> bool:
    if lower in w.TECH_NAMES:
        return True
    if lower in w.I_FORMS:
        return False
    if any(char.isdigit() for char in token):
        # "GPT-4", "H100", "iPhone15", "k8s"; digit-first tokens ("2nd", "5kg") are numbers.
        return bool(_LETTER_THEN_DIGIT.search(token))
    if shouting or not token[0].isalpha():
        return False
    if token.isupper() and len(token) > 1:
        # An acronym ("AWS"), unless a common word in capitals for emphasis ("NOT", "WHY").
        return not (lower in w.OPENERS or lower.replace("'", "") in w.NEGATIONS)
    if _CAMEL.search(token):  # "PyTorch", "macOS"; not "big-O"
        return True
    return token[0].isupper() and not (initial and lower in w.OPENERS)


def _stems(words: tuple[str, ...]) -> frozenset[str]:
    stems = set()
    for word in words:
        if "-" in word:
            first, _, rest = word.partition("-")
            if first in w.OPPOSITE_PREFIXES:  # "non-toxic" is "nontoxic", not "toxic"
                stems.add(w.stem(first + rest.replace("-", "")))
                continue
            stems.update(w.stem(part) for part in word.split("-"))
        elif word not in _NO_STEM and word.isalpha():
            stems.add(w.stem(word))
    return frozenset(stems)


def _question(words: tuple[str, ...]) -> frozenset[str]:
    kinds = set()
    for word, after in pairwise((*words, "")):
        if word in w.QUESTION_WORDS:
            kinds.add(w.QUESTION_WORDS[word])
        elif word == "how" and after in w.HOW_WORDS:
            kinds.add("quantity")
        elif word in ("what", "which") and after in w.WHAT_TIME_WORDS:
            kinds.add("time")
    return frozenset(kinds)


def _negations(words: tuple[str, ...], text: str) -> int:
    # "can't" and "cannot" are one each; "n't" is counted in the text, the rest by word.
    count = sum(map(w.NEGATIONS.__contains__, words)) + text.count("n't") + text.count("N'T")
    if w.NEGATING.isdisjoint(words):
        return count
    for index, word in enumerate(words):
        later = words[index + 1 : index + 5]
        count += word in w.NEGATING_VERBS or (
            (word in w.NEGATING_BEFORE_ING and any(x.endswith("ing") for x in later))
            or (word in w.NEGATING_BEFORE_FROM and "from" in later)
        )
    return count


def analyze(text: str) -> Analysis:
    # The common token is a plain lowercase word; the loop keeps it off the slow paths.
    text = _APOSTROPHES.sub("'", text)
    shouting = text.isupper()  # all caps: capitals carry no information
    words: list[str] = []
    compacts: list[str] = []
    entities: set[str] = set()
    for sentence in _SENTENCES.split(text):
        initial = True
        for token in _TOKEN.findall(sentence):
            if token.isalpha() and token.islower():
                lower = token
                compact = w.ALIASES.get(token, token)
                if lower in w.TECH_NAMES:
                    entities.add(compact)
            else:
                lower = token.lower()
                compact = _compact(token, lower)
                if _is_entity(token, lower, initial, shouting):
                    entities.add(compact)
            initial = False
            words.append(lower)
            compacts.append(compact)
    frozen, compact_words = tuple(words), tuple(compacts)
    quotes = ()
    if "'" in text or '"' in text or "“" in text:
        found = _QUOTED.findall(text)
        quotes = tuple(" ".join(_TOKEN.findall((a or b or c).lower())) for a, b, c in found)
    particles = _NONE
    if not w.PARTICLES.keys().isdisjoint(frozen):
        particles = frozenset(
            (w.stem(verb), particle)
            for verb, particle in pairwise(frozen)
            if particle in w.PARTICLES and verb.isalpha() and verb not in w.FUNCTION_WORDS
        )
    return Analysis(
        words=frozen,
        compacts=compact_words,
        negations=_negations(frozen, text),
        numbers=_numbers(text, frozen),
        units=frozenset(w.MEASURE_UNITS[word] for word in frozen if word in w.MEASURE_UNITS),
        entities=frozenset(entities),
        quotes=quotes,
        stems=_stems(frozen),
        particles=particles,
        question=_question(frozen),
        directions=_NONE
        if w.DIRECTION_WORDS.isdisjoint(frozen)
        else _directions(frozen, compact_words),
    )


def _contains(features: Analysis, entities: frozenset[str]) -> bool:
    """Whether every entity is a word of `features`, also split, joined or with an ending:
    "GPT4" is in "gpt 4" and "GPT-4"; "python" in "python3"; "Africa" in "African"."""
    missing = entities.difference(features.compacts)
    if not missing:  # the common case: no need to build the split and joined forms
        return True
    compacts = features.compacts
    keys = {a + b for a, b in pairwise(compacts)}
    keys.update(a + b + c for a, b, c in zip(compacts, compacts[1:], compacts[2:], strict=False))
    for compact in compacts:
        if not (compact.isalpha() or compact.isdigit()):
            keys.update(_RUNS.findall(compact))
    keys.update(compacts)
    for compact in compacts:
        keys.update(w.ALIAS_PARTS.get(compact, ()))
    for entity in missing - keys:
        if not any(
            (key.startswith(entity) and key[len(entity) :] in w.ENTITY_SUFFIXES)
            or (len(key) > 2 and entity.startswith(key) and entity[len(key) :] in w.ENTITY_SUFFIXES)
            for key in keys
        ):
            return False
    return True


def _entities_differ(one: Analysis, other: Analysis) -> bool:
    if not (_contains(other, one.entities) and _contains(one, other.entities)):
        return True
    if not (one.quotes or other.quotes):
        return False
    one_phrase, other_phrase = f" {' '.join(one.words)} ", f" {' '.join(other.words)} "
    return any(f" {quote} " not in other_phrase for quote in one.quotes) or any(
        f" {quote} " not in one_phrase for quote in other.quotes
    )


def _has_antonym(one: Analysis, other: Analysis) -> bool:
    only_one, only_other = one.stems - other.stems, other.stems - one.stems
    for stem in only_one:
        opposites = w.ANTONYMS.get(stem)
        if opposites and not opposites.isdisjoint(only_other):
            return True
        prefixes = w.OPPOSITE_PREFIXES if len(stem) > 3 else w.SHORT_OPPOSITE_PREFIXES
        if len(stem) > 2 and any(prefix + stem in only_other for prefix in prefixes):
            return True
    return any(
        (verb, w.PARTICLES[particle]) in other.particles
        for verb, particle in one.particles - other.particles
    )


def _directions(words: tuple[str, ...], compacts: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    """(source, target) pairs: "A to B", "A into B", "from A to B" and "to B from A" give (A, B)."""
    pairs, targets, source = set(), [], None
    for index, word in enumerate(words):
        if word in w.DIRECTION_WORDS:
            after = next(
                (i for i in range(index + 1, len(words)) if words[i] not in w.DETERMINERS), 0
            )
            if not after:
                continue
            if word == "from":
                source = (index, compacts[after])
                continue
            targets.append((index, compacts[after]))
            if index and words[index - 1] not in w.FUNCTION_WORDS:
                pairs.add((compacts[index - 1], compacts[after]))
    if source and targets:  # "to" nearest to "from": "the way to get to London from Heathrow"
        target = min(targets, key=lambda found: abs(found[0] - source[0]))[1]
        pairs.add((source[1], target))
    return frozenset(pairs)


def _order_differs(one: Analysis, other: Analysis) -> bool:
    """The same two things the other way round: "USD to EUR" vs "EUR to USD", "from New York to
    London" vs "to New York from London"."""
    return any(
        (b, a) in other.directions and (a, b) not in other.directions for a, b in one.directions
    )


def refusal(
    query: str | Analysis,
    cached: str | Analysis,
    *,
    min_words: int = 3,
    skip: frozenset[str] = frozenset(),
) -> str | None:
    """Why `query` must not be answered with the answer cached for `cached`, or None.

    Reasons, checked in this order: "too_short" (the query has fewer than `min_words` words: too
    little to judge its meaning), "negation", "numbers", "entities", "antonym", "order" (also
    values reordered and sides swapped: `guard_order`), "scope", "question". `skip`: reasons
    not checked (left to the pair verifier: pair_verifier.JUDGED_BY_VERIFIER). Either text may
    come analyzed already (`analyze`): a cache that stores the analysis of each cached question
    pays ~25 µs per lookup plus ~5 µs per candidate, instead of ~30-70 µs per candidate."""
    asked = query if isinstance(query, Analysis) else analyze(query)
    if len(asked.words) < min_words:
        return "too_short"
    stored = cached if isinstance(cached, Analysis) else analyze(cached)
    checks = (
        ("negation", lambda: asked.negations != stored.negations),
        ("numbers", lambda: asked.numbers != stored.numbers or asked.units != stored.units),
        ("entities", lambda: _entities_differ(asked, stored)),
        ("antonym", lambda: _has_antonym(asked, stored) or _has_antonym(stored, asked)),
        (
            "order",
            lambda: (
                _order_differs(asked, stored)
                or values_reordered(asked.words, stored.words)
                or sides_swapped(asked.words, stored.words)
            ),
        ),
        ("scope", lambda: scope_differs(asked.words, stored.words)),
        (
            "question",
            lambda: bool(asked.question and stored.question) and asked.question != stored.question,
        ),
    )
    return next((reason for reason, differ in checks if reason not in skip and differ()), None)
