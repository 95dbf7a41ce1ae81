"""The built-in guardrail detectors: emails, phone numbers, payment cards, secrets, blocklists.

Pure text functions (no I/O). Every detector answers two questions:
``find(text)``: the spans that match; ``hold_from(text)``: where the shortest tail of ``text``
starts that could still become (or grow into) a match when more text arrives (a stream holds that
tail back; ``len(text)`` means nothing needs holding).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """A match: ``text[start:end]``, of ``kind`` (email, phone, card, secret, blocklist, ...)."""

    start: int
    end: int
    kind: str


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries (ISO/IEC 7812)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


_DIGITS = re.compile(r"\d+", re.ASCII)
_NOT_DIGITS = re.compile(r"\D", re.ASCII)


def _tail_run(text: str, allowed: re.Pattern[str], starts: re.Pattern[str], cap: int) -> int:
    """Where the trailing run of ``allowed`` characters begins (at most ``cap`` long), moved
    forward to its first character that can start a match."""
    index = len(text)
    limit = max(0, len(text) - cap)
    while index > limit and allowed.match(text, index - 1):
        index -= 1
    while index < len(text) and not starts.match(text, index):
        index += 1
    return index


class EmailDetector:
    kind = "email"
    _pattern = re.compile(
        r"(?<![\w.%+-])[A-Za-z0-9][\w.%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
        re.ASCII,
    )
    _allowed = re.compile(r"[\w.%+@-]", re.ASCII)
    _starts = re.compile(r"[A-Za-z0-9]")

    def find(self, text: str) -> list[Finding]:
        return [Finding(m.start(), m.end(), self.kind) for m in self._pattern.finditer(text)]

    def hold_from(self, text: str) -> int:
        return _tail_run(text, self._allowed, self._starts, 254)  # RFC 5321's longest address


class PhoneDetector:
    """International numbers (+ and 8-15 digits, E.164), North American ``(555) 123-4567`` /
    ``555-123-4567``, and national numbers with a trunk 0 (``020 7946 0958``, ``06 12 34 56 78``).
    A bare run of digits (an id, an amount, a year) is not a phone number: it needs a ``+``, a
    leading 0 or the separators of a written phone number."""

    kind = "phone"
    _pattern = re.compile(
        r"(?<![\w+.-])(?:"
        r"\+\d{1,3}(?:[ .-]?\(\d{1,4}\))?(?:[ .-]?\d{1,5}){2,6}"  # international
        r"|\(\d{3}\)[ ]?\d{3}[ .-]\d{4}"  # (555) 123-4567
        r"|\d{3}[.-]\d{3}[.-]\d{4}"  # 555-123-4567
        r"|0\d{1,4}(?:[ .-]\d{2,8}){1,4}"  # 020 7946 0958, 030 1234567
        r"|0\d{9,10}"  # 0612345678
        r")(?![\w.-]?\d)",
        re.ASCII,
    )
    _allowed = re.compile(r"[\d ().+-]")
    _starts = re.compile(r"[\d+(]")

    def find(self, text: str) -> list[Finding]:
        found, position = [], 0
        while (match := self._pattern.search(text, position)) is not None:
            end = self._phone_end(match.group())
            if end is None:
                position = match.end()
                continue
            found.append(Finding(match.start(), match.start() + end, self.kind))
            position = match.start() + end
        return found

    @staticmethod
    def _phone_end(number: str) -> int | None:
        """How much of ``number`` is a phone number: all of it, else its longest run of digit
        groups that is (the pattern runs on into a following number: "+44 20 7946 0958 2024")."""
        group_ends = [m.end() for m in _DIGITS.finditer(number)]
        for end in reversed(group_ends):
            if end == group_ends[0] and end != len(number):
                break  # one group cut from a longer number is no phone number
            prefix = number[:end]
            digits = sum(char.isdigit() for char in prefix)
            if prefix.startswith("+"):
                is_phone = 8 <= digits <= 15
            elif prefix.startswith("0"):
                is_phone = 9 <= digits <= 12
            else:
                is_phone = digits == 10 and end == len(number)  # the exact North American shapes
            if is_phone:
                return end
        return None

    def hold_from(self, text: str) -> int:
        return _tail_run(text, self._allowed, self._starts, 64)


class CardDetector:
    """13-19 digits, optionally grouped by spaces or dashes, that pass the Luhn check: a number
    that fails it is not a card (order ids, phone numbers, timestamps)."""

    kind = "card"
    _run = re.compile(r"(?<![\w-])\d+(?:[ -]\d+)*(?![\w])", re.ASCII)
    _allowed = re.compile(r"[\d -]")
    _starts = re.compile(r"\d")

    def find(self, text: str) -> list[Finding]:
        found = []
        for run in self._run.finditer(text):
            found.extend(self._cards_in(run.group(), run.start()))
        return found

    def _cards_in(self, run: str, offset: int) -> Iterable[Finding]:
        """The card numbers among ``run``'s digit groups: each whole run of groups that holds a
        Luhn-valid 13-19 digit number, the longest first (a card followed by a year)."""
        groups = [(m.start(), m.end()) for m in _DIGITS.finditer(run)]
        first = 0
        while first < len(groups):
            for last in range(len(groups) - 1, first - 1, -1):
                start, end = groups[first][0], groups[last][1]
                digits = _NOT_DIGITS.sub("", run[start:end])
                if 13 <= len(digits) <= 19 and luhn_valid(digits):
                    yield Finding(offset + start, offset + end, self.kind)
                    first = last
                    break
            first += 1

    def hold_from(self, text: str) -> int:
        return _tail_run(text, self._allowed, self._starts, 64)


# Vendor key formats; a prefix alone (``sk-`` in prose) is not a key: each needs its body.
_SECRET_PATTERNS = (
    r"\bsk-(?:proj-|ant-|live-|test-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{22,}\b",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API keys
    # An Authorization header's credential ("Bearer", any case).
    r"\b[Bb][Ee][Aa][Rr][Ee][Rr][ \t]+[A-Za-z0-9._~+/-]{16,}=*",
)
# Generic tokens: long, mixing upper and lower case letters and digits, and random-looking.
# Hex digests, UUIDs, words and paths do not qualify (no mixed case, or too regular).
_GENERIC_TOKEN = re.compile(r"(?<![\w+/=-])[A-Za-z0-9_+=-]{32,}(?![\w+/=-])", re.ASCII)
MIN_TOKEN_ENTROPY_BITS = 4.0  # per character; English words score ~3, random base62 ~5


def shannon_entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _is_random_token(token: str) -> bool:
    return (
        any(c.isupper() for c in token)
        and any(c.islower() for c in token)
        and any(c.isdigit() for c in token)
        and shannon_entropy(token) >= MIN_TOKEN_ENTROPY_BITS
    )


class SecretDetector:
    kind = "secret"
    # ASCII word boundaries: a key right after CJK text (Unicode letters) still starts a word.
    _patterns = re.compile("|".join(f"(?:{p})" for p in _SECRET_PATTERNS), re.ASCII)
    # ASCII only: a run of CJK text (\w in Unicode) is no token and is not held back.
    _allowed = re.compile(r"[\w+/=.~-]", re.ASCII)
    _starts = _allowed
    _bearer_tail = re.compile(r"(?i)\b(?:b|be|bea|bear|beare|bearer)(?:[ \t]+[\w.~+/=-]*)?\Z")

    def find(self, text: str) -> list[Finding]:
        found = [Finding(m.start(), m.end(), self.kind) for m in self._patterns.finditer(text)]
        for match in _GENERIC_TOKEN.finditer(text):
            if _is_random_token(match.group()) and not _overlaps(match, found):
                found.append(Finding(match.start(), match.end(), self.kind))
        return found

    def hold_from(self, text: str) -> int:
        bearer = self._bearer_tail.search(text[-300:])
        tail = _tail_run(text, self._allowed, self._starts, 256)
        if bearer is None:
            return tail
        return min(tail, len(text) - len(text[-300:]) + bearer.start())


def _overlaps(match: re.Match[str], found: list[Finding]) -> bool:
    return any(f.start < match.end() and match.start() < f.end for f in found)


class BlocklistDetector:
    """Words and phrases, case-insensitive, whole words only (``ass`` does not hit ``class``);
    whitespace inside a phrase matches any run of whitespace."""

    kind = "blocklist"

    def __init__(self, phrases: Iterable[str]):
        self._phrases = tuple(" ".join(p.casefold().split()) for p in phrases)
        alternatives = "|".join(
            r"\s+".join(re.escape(word) for word in phrase.split())
            for phrase in sorted(self._phrases, key=len, reverse=True)
        )
        self._pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)

    def find(self, text: str) -> list[Finding]:
        return [Finding(m.start(), m.end(), self.kind) for m in self._pattern.finditer(text)]

    def hold_from(self, text: str) -> int:
        """The longest tail that is the beginning of a phrase (or a whole phrase, whose next
        character decides whether it is a whole word) and starts on a word boundary."""
        longest = 2 * max(len(phrase) for phrase in self._phrases)  # room for wide spacing
        for start in range(max(0, len(text) - longest), len(text)):
            if text[start].isspace() or (start > 0 and _WORD.match(text, start - 1)):
                continue
            tail = _SPACES.sub(" ", text[start:].casefold())
            if any(phrase.startswith(tail) for phrase in self._phrases):
                return start
        return len(text)


_WORD = re.compile(r"\w")
_SPACES = re.compile(r"\s+")


class PatternDetector:
    """The policy's own regexes; a stream holds back a fixed ``hold_chars`` for them."""

    kind = "pattern"

    def __init__(self, patterns: Iterable[str], hold_chars: int):
        self._patterns = tuple(re.compile(p) for p in patterns)
        self._hold_chars = hold_chars

    def find(self, text: str) -> list[Finding]:
        return [
            Finding(m.start(), m.end(), self.kind)
            for pattern in self._patterns
            for m in pattern.finditer(text)
            if m.end() > m.start()
        ]

    def hold_from(self, text: str) -> int:
        return max(0, len(text) - self._hold_chars)


BUILTIN_DETECTORS = {
    "email": EmailDetector,
    "phone": PhoneDetector,
    "card": CardDetector,
    "secret": SecretDetector,
}


def redact(text: str, findings: Iterable[Finding]) -> str:
    """``text`` with every finding replaced by ``[REDACTED_<KIND>]``; overlapping findings are
    merged (the first one's kind names the placeholder)."""
    pieces, position = [], 0
    for start, end, kind in merge(findings):
        pieces.append(text[position:start])
        pieces.append(placeholder(kind))
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def placeholder(kind: str) -> str:
    return f"[REDACTED_{kind.upper()}]"


def merge(findings: Iterable[Finding]) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []
    for finding in sorted(findings, key=lambda f: (f.start, -f.end)):
        if spans and finding.start < spans[-1][1]:
            start, end, kind = spans[-1]
            spans[-1] = (start, max(end, finding.end), kind)
        else:
            spans.append((finding.start, finding.end, finding.kind))
    return spans
