"""Encoding with the stretches between added tokens cached.

An HF tokenizer splits text at its added tokens (``<|im_start|>``, ``<|im_end|>``...) before
anything else and encodes each stretch between them on its own. A chat template puts those tokens
around every message, so a conversation's prompt is the same stretches turn after turn: context
trimming counts the whole conversation's tokens several times a turn (7,700 tokens took ~16 ms
each), and the engine encodes the kept part once more. Cached by stretch, only a turn's new
messages are encoded; the ids are those of one encode of the whole text.

Where that equivalence may not hold, no cache: added tokens that strip the whitespace beside them
or match only whole words or after normalization (the stretches would not be the tokenizer's), or
a tokenizer whose encoding of a probe text differs stretch by stretch (a pre-tokenizer that treats
the text's first stretch apart, as Metaspace's ``prepend_scheme: first`` does).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

from tokenizers import Tokenizer as HFTokenizer

# Characters of stretches kept (a stretch is a message's text, give or take): many conversations'
# worth, a few MB of ids.
MAX_CACHED_CHARS = 2_000_000
_PROBE_STRETCHES = (" Hello there,\nhow are you?", "user\nTell me 12 facts", "\n\n  spaced  out ",
                    "assistant\nSure: 3.14 is π.", "", "naïve café ümlaut", "x")  # fmt: skip


class SegmentCache:
    """``encode(text)``: the tokenizer's ids for ``text`` (no special tokens added), each stretch
    between added tokens encoded once and then looked up. Thread-safe."""

    def __init__(self, tokenizer: HFTokenizer, added: dict[str, int]):
        self._tokenizer = tokenizer
        self._added = added
        # leftmost match, longest first where two start at one place (the tokenizer's rule)
        pattern = "|".join(re.escape(token) for token in sorted(added, key=len, reverse=True))
        self._split = re.compile(f"({pattern})")
        self._stretches: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    @classmethod
    def for_tokenizer(cls, tokenizer: HFTokenizer) -> SegmentCache | None:
        """A cache for ``tokenizer``, or None where stretches may not encode as the whole does."""
        decoder = tokenizer.get_added_tokens_decoder()
        if not decoder or getattr(tokenizer, "encode_special_tokens", False):
            return None  # none to split at, or added tokens' text encoded as text
        if any(
            t.lstrip or t.rstrip or t.single_word or t.normalized or not t.content
            for t in decoder.values()
        ):
            return None
        cache = cls(tokenizer, {t.content: token_id for token_id, t in decoder.items()})
        tokens = [t.content for t in decoder.values()][:3]
        probe = "".join(s + tokens[i % len(tokens)] for i, s in enumerate(_PROBE_STRETCHES))
        probe += _PROBE_STRETCHES[0]
        whole = tokenizer.encode(probe, add_special_tokens=False).ids
        return cache if cache.encode(probe) == whole else None

    @property
    def cached_chars(self) -> int:
        return self._chars

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for index, piece in enumerate(self._split.split(text)):
            if index % 2:  # the split keeps its matches at odd places
                ids.append(self._added[piece])
            elif piece:
                ids.extend(self._stretch(piece))
        return ids

    def _stretch(self, piece: str) -> list[int]:
        with self._lock:
            cached = self._stretches.get(piece)
            if cached is not None:
                self._stretches.move_to_end(piece)
                return cached
        ids = self._tokenizer.encode(piece, add_special_tokens=False).ids
        if len(piece) > MAX_CACHED_CHARS // 4:  # one huge text would push out all the rest
            return ids
        with self._lock:
            if piece not in self._stretches:
                self._stretches[piece] = ids
                self._chars += len(piece)
                while self._chars > MAX_CACHED_CHARS:
                    evicted, _ = self._stretches.popitem(last=False)
                    self._chars -= len(evicted)
        return ids
