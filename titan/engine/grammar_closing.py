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
from collections.abc import Callable

import llguidance

# What ends a value first, then what moves on to the next one (before a digit: a number would
# otherwise grow forever), then the shortest values, then the rest.
_PREFERRED = b'"}])' + b",: " + b"0123456789" + b"tfn-.eE+" + string.ascii_lowercase.encode()
_ORDER = _PREFERRED + bytes(b for b in range(256) if b not in _PREFERRED)
# A state (set of allowed tokens) met this often in one walk: the walk goes round in a loop.
_LOOP_VISITS = 32


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
        self._token_bytes = token_bytes
        self._encode = encode

    def completion(self, matcher: llguidance.LLMatcher, limit: int) -> list[int] | None:
        """Tokens that bring ``matcher`` to a state where the grammar may end, at most ``limit``
        bytes long; None when the walk finds none that short. [] when it may end already."""
        walked = self._walk(matcher, limit, avoid_loops=False)
        if walked is None:
            walked = self._walk(matcher, limit, avoid_loops=True)
        return None if walked is None else self._shorter(matcher, *walked)

    def _walk(
        self, matcher: llguidance.LLMatcher, limit: int, avoid_loops: bool
    ) -> tuple[bytes, list[int]] | None:
        """(text, tokens) of the greedy walk. The plain walk gives up on a state (a set of
        allowed tokens) met too often: a loop. The loop-avoiding one takes, from a state met
        before, a byte not taken from it yet; it is the second try because states that allow
        the same tokens (every empty string value) are not always the same state."""
        walker = matcher.deep_copy()
        text = bytearray()
        token_ids: list[int] = []
        taken: dict[int, list[int]] = {}  # allowed-token set (hashed) -> bytes taken from it
        while not walker.is_accepting():
            if len(text) >= limit or walker.is_error():
                return None
            forced = walker.compute_ff_tokens()
            if forced:  # a key's name, a literal: the grammar's own tokens
                walker.consume_tokens(forced)
                token_ids.extend(forced)
                text.extend(b"".join(self._token_bytes(t) for t in forced))
                continue
            mask = walker.compute_bitmask()
            allowed = [(b, t) for b, t in self._order if mask[t >> 3] >> (t & 7) & 1]
            if not allowed:
                return None
            choice = self._ending(walker, allowed)
            if choice is None:
                seen = taken.setdefault(hash(mask), [])
                if not avoid_loops and len(seen) >= _LOOP_VISITS:
                    return None
                fresh = (c for c in allowed if avoid_loops and c[0] not in seen)
                choice = next(fresh, allowed[0])
                seen.append(choice[0])
                walker.consume_token(choice[1])
            text.append(choice[0])
            token_ids.append(choice[1])
        return bytes(text), token_ids

    @staticmethod
    def _ending(walker: llguidance.LLMatcher, allowed: list[tuple[int, int]]):
        """The first allowed (byte, token) after which the grammar may end, consumed; else None
        with the walker unchanged."""
        for choice in allowed:
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
    """

    def __init__(self, closer: GrammarCloser, eos_token_id: int):
        self._closer = closer
        self._eos_token_id = eos_token_id
        self._window: int | None = None
        self._plan: list[int] | None = None  # None: outside the window (or no way out found)
        self._next: tuple[int, list[int]] | None = None  # (vetted token, the plan after it)

    def forced_token(self, matcher: llguidance.LLMatcher, remaining: int) -> int | None:
        """Before sampling: the one token allowed, or None to sample as usual."""
        if self._window is None:
            first = self._closer.completion(matcher, limit=MINIMUM_SEARCH_BYTES)
            self._window = CLOSING_WINDOW + 2 * len(first or ())
        if remaining > self._window:
            self._plan = None
            return None
        if self._plan is None:
            self._plan = self._closer.completion(matcher, limit=BYTES_PER_TOKEN * remaining)
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
            following = self._closer.completion(after, limit=BYTES_PER_TOKEN * max(left, 1))
            if following is not None and len(following) <= left:
                self._next = (token_id, following)
                return token_id
        return plan[0] if plan else self._eos_token_id

    def advanced(self, token_id: int) -> None:
        """The matcher took ``token_id``: move the plan along with it."""
        if self._next is not None and self._next[0] == token_id:
            self._plan = self._next[1]
        elif self._plan and self._plan[0] == token_id:
            self._plan = self._plan[1:]
        else:
            self._plan = None
        self._next = None
