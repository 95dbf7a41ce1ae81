"""A short way out of any grammar: the text that ends a constrained answer from where it is.

A constrained request near the end of its budget is steered into this text, token by token, so
that JSON (with a schema or without), a regex, a choice or a forced tool call is whole when
``max_tokens`` runs out; and a request whose grammar cannot be satisfied within ``max_tokens``
at all is refused before it runs (400 naming the minimum).

The walk is greedy, over single bytes, on a copy of the request's llguidance matcher. At each
step: a byte after which the grammar may end, when one is allowed; else the first allowed byte
in an order that prefers what ends things (a closing quote or bracket, then separators, then the
shortest values, then anything) and that was not already taken from a state that allowed the
same tokens (so a loop such as "a, a, a, ..." in ``[a-z]+(, [a-z]+)*\\.`` moves on to another
byte). Not the provably shortest text (that would be a search over the grammar), but it closes
JSON documents, tool-call arrays, choices, regexes and grammars in a handful of bytes, and it
never leaves the grammar: every byte is the matcher's own yes. The bytes are then written with
the tokenizer's longer tokens when the grammar takes those, else one token per byte.
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable

import llguidance
import numpy as np

# What ends a value first (and the "@" an email needs), then what moves on to the next one
# (before a digit: a number would otherwise grow forever), then the shortest values (1 before 0:
# "1111-11-11" is a date to every validator, year 0000 is not), then the rest.
_PREFERRED = b'"@}])' + b",: " + b"1023456789" + b"tfn-.eE+" + string.ascii_lowercase.encode()
_ORDER = _PREFERRED + bytes(b for b in range(256) if b not in _PREFERRED)
# Bytes tried for "the grammar may end right after it": the preferred ones, up to "." and "e".
_ENDING_CANDIDATES = 24
# A state (set of allowed tokens) met this often without forced text between: a loop.
_LOOP_VISITS = 8


class GrammarCloser:
    """Built once per tokenizer: which token stands for each single byte."""

    def __init__(self, token_bytes: Callable[[int], bytes], vocab_size: int,
                 encode: Callable[[str], list[int]]):  # fmt: skip
        byte_tokens: list[int | None] = [None] * 256
        for token_id in range(vocab_size):
            piece = token_bytes(token_id)
            if len(piece) == 1 and byte_tokens[piece[0]] is None:
                byte_tokens[piece[0]] = token_id
        self._order = [(b, byte_tokens[b]) for b in _ORDER if byte_tokens[b] is not None]
        # Where each of those tokens' bit is in a bitmask: byte index and bit within it.
        ids = np.array([t for _, t in self._order], dtype=np.int64)
        self._mask_bytes, self._mask_bits = ids >> 3, (ids & 7).astype(np.uint8)
        self._token_bytes = token_bytes
        self._encode = encode

    def completion(self, matcher: llguidance.LLMatcher, limit: int) -> list[int] | None:
        """Tokens that bring ``matcher`` to a state where the grammar may end, at most ``limit``
        bytes long; None when the walk finds none that short. [] when it may end already."""
        walked = self._walk(matcher, limit, patience=_LOOP_VISITS)
        if walked is None:
            walked = self._walk(matcher, limit, patience=1)
        return None if walked is None else self._shorter(matcher, *walked)

    def _walk(
        self, matcher: llguidance.LLMatcher, limit: int, patience: int
    ) -> tuple[bytes, list[int]] | None:
        """(text, tokens) of the greedy walk. A state (a set of allowed tokens) met more than
        ``patience`` times is a loop (an email's local part growing "}}}}", a cron field
        "@@@@" that needs a space): from it the walk takes a byte that leads elsewhere
        (``_escape``). The first walk is patient and counts visits only since the grammar last
        forced text (a new key's name), because states that allow the same tokens (every empty
        string value) are not always the same state; the second, when the first finds no end,
        escapes at the first revisit and explores states not met yet."""
        walker = matcher.deep_copy()
        text = bytearray()
        token_ids: list[int] = []
        visits: Counter[int] = Counter()  # allowed-token set (hashed) -> times met
        while not walker.is_accepting():
            if len(text) >= limit or walker.is_error():
                return None
            forced = walker.compute_ff_tokens()
            if forced:  # a key's name, a literal: the grammar's own tokens
                walker.consume_tokens(forced)
                token_ids.extend(forced)
                text.extend(b"".join(self._token_bytes(t) for t in forced))
                if patience > 1:
                    visits.clear()
                continue
            mask = walker.compute_bitmask()
            allowed = self._allowed(mask)
            if not allowed:
                return None
            state = hash(mask)
            visits[state] += 1
            choice = self._ending(walker, allowed)
            if choice is None:
                if visits[state] > patience:
                    choice = self._escape(walker, allowed, state, visits, explore=patience == 1)
                else:
                    choice = allowed[0]
                walker.consume_token(choice[1])
            text.append(choice[0])
            token_ids.append(choice[1])
        return bytes(text), token_ids

    def _allowed(self, mask: bytes) -> list[tuple[int, int]]:
        """The (byte, token) pairs the bitmask allows, in the walk's order."""
        words = np.frombuffer(mask, dtype=np.uint8)[self._mask_bytes]
        order = self._order
        return [order[i] for i in np.flatnonzero((words >> self._mask_bits) & 1)]

    @staticmethod
    def _escape(
        walker: llguidance.LLMatcher,
        allowed: list[tuple[int, int]],
        state: int,
        visits: Counter,
        explore: bool,
    ) -> tuple[int, int]:
        """From a state met too often, the walker unchanged: the first allowed (byte, token)
        that leads to another state (a cron field's space: the loop that it closes counts the
        fields, so taking it again is progress); exploring, the first that leads to a state not
        met yet (``(ab)*c`` needs its "c"), then to another state; else the first allowed."""
        other = unmet = None
        for choice in allowed:
            walker.consume_token(choice[1])
            following = hash(walker.compute_bitmask())
            walker.rollback(1)
            if other is None and following != state:
                other = choice
                if not explore:
                    break
            if following not in visits:
                unmet = choice
                break
        return (unmet or other or allowed[0]) if explore else (other or allowed[0])

    @staticmethod
    def _ending(walker: llguidance.LLMatcher, allowed: list[tuple[int, int]]):
        """The first allowed (byte, token) after which the grammar may end, consumed; else None
        with the walker unchanged. Only the first few preferred bytes are tried (all of them,
        inside a string, would cost ~0.1 ms a byte); an end behind them is reached by the
        walk's own order, or its loop escape."""
        for choice in allowed[:_ENDING_CANDIDATES]:
            walker.consume_token(choice[1])
            if walker.is_accepting():
                return choice
            walker.rollback(1)
        return None

    def _shorter(
        self, matcher: llguidance.LLMatcher, text: bytes, token_ids: list[int]
    ) -> list[int]:
        """The same text in the tokenizer's own tokens, when the grammar takes them."""
        try:
            encoded = self._encode(text.decode("utf-8"))
        except UnicodeDecodeError:
            return token_ids
        if len(encoded) < len(token_ids) and matcher.validate_tokens(encoded) == len(encoded):
            return encoded
        return token_ids


# The closing text is looked for up to this many bytes a token (a few times what one takes).
BYTES_PER_TOKEN = 4
# A request's first closing text, and the 400 for budgets too small for any valid output.
MINIMUM_SEARCH_BYTES = 4096
# Steering starts this many tokens before max_tokens, plus twice the shortest whole output (a
# sampled token that opens a key or an array item lengthens the way out by about one value).
CLOSING_WINDOW = 32


class ClosingBudget:
    """Keeps one constrained request able to end within ``max_tokens``.

    Inside the window it knows a closing text (a plan) from the grammar's current state. Before
    sampling: when the tokens left are no more than the plan, the plan's next token is the only
    choice. After sampling: a token is kept only when the grammar can still end in the tokens
    left after it; else the plan's next token (or EOS, where the grammar may end) replaces it.
    So the invariant "a way out fits" holds from the first step to the last.

    The walk costs ~0.3 ms; most steps are inside a string or between values whose way out was
    walked before, so the last way out found from each set of allowed tokens is tried first
    (a check of a few µs that it still ends the grammar from here) and walked anew only when
    it does not, or when it would not fit.
    """

    def __init__(self, closer: GrammarCloser, eos_token_id: int):
        self._closer = closer
        self._eos_token_id = eos_token_id
        self._window: int | None = None
        self._plan: list[int] | None = None  # None: outside the window (or no way out found)
        self._next: tuple[int, list[int]] | None = None  # (vetted token, the plan after it)
        self._known: dict[int, list[int]] = {}  # allowed-token set (hashed) -> its way out

    def forced_token(self, matcher: llguidance.LLMatcher, remaining: int) -> int | None:
        """Before sampling: the one token allowed, or None to sample as usual."""
        if self._window is None:
            first = self._closer.completion(matcher, limit=MINIMUM_SEARCH_BYTES)
            self._window = CLOSING_WINDOW + 2 * len(first or ())
        if remaining > self._window:
            self._plan = None
            return None
        if self._plan is None:
            self._plan = self._way_out(matcher, remaining)
        if self._plan and len(self._plan) >= remaining:
            return self._plan[0]
        return None

    def vet(self, matcher: llguidance.LLMatcher, token_id: int, remaining: int) -> int:
        """After sampling ``token_id`` with ``remaining`` tokens left (it included): the token
        to emit."""
        plan = self._plan
        if plan is None or (plan and token_id == plan[0]):
            return token_id
        after = matcher.deep_copy()
        if after.consume_token(token_id):
            left = remaining - 1
            following = self._way_out(after, left, hint=plan)
            if following is not None and len(following) <= left:
                self._next = (token_id, following)
                return token_id
        return plan[0] if plan else self._eos_token_id

    def _way_out(
        self, matcher: llguidance.LLMatcher, remaining: int, hint: list[int] | None = None
    ) -> list[int] | None:
        """A closing text from ``matcher``'s state: ``hint`` (the way out before the last token:
        a token inside a string leaves it the same), or the one known for these allowed tokens,
        when it still ends the grammar and fits; else a new walk."""
        if matcher.is_accepting():
            return []
        if hint and len(hint) <= remaining and _ends(matcher, hint):
            return hint
        key = hash(matcher.compute_bitmask())
        known = self._known.get(key)
        if known is not None and len(known) <= remaining and _ends(matcher, known):
            return known
        walked = self._closer.completion(matcher, limit=BYTES_PER_TOKEN * max(remaining, 1))
        if walked is not None:
            self._known[key] = walked
        return walked

    def advanced(self, token_id: int) -> None:
        """The matcher took ``token_id``: move the plan along with it."""
        if self._next is not None and self._next[0] == token_id:
            self._plan = self._next[1]
        elif self._plan and self._plan[0] == token_id:
            self._plan = self._plan[1:]
        else:
            self._plan = None
        self._next = None


def _ends(matcher: llguidance.LLMatcher, token_ids: list[int]) -> bool:
    """Whether ``token_ids`` take ``matcher`` to a state where the grammar may end (checked and
    undone)."""
    taken = matcher.try_consume_tokens(token_ids)
    ends = taken == len(token_ids) and matcher.is_accepting()
    matcher.rollback(taken)
    return ends
