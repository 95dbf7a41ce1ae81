"""Context shift: a prompt that drops tokens from the middle of a sequence the engine computed
recently (a conversation trimmed of its oldest turns) reuses that sequence's KV for what it kept.

Pure Python. Keys carry their position through RoPE, a rotation: a key computed at position
``q + d`` becomes the key at ``q`` by rotating it back by ``d`` (the runner does it while copying),
so the kept tokens after the dropped ones need no recompute. The reused KV is approximate: it was
computed with the dropped tokens still in front (llama.cpp's context shift and StreamingLLM make
the same trade). So shifting is per request (opted in with a *scope*, a conversation), its blocks
are published only under scope-salted keys (never served to a request that wants exact KV), and
the source is only ever the same scope's last sequence.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

# Scopes remembered (one sequence each, its token ids in 4 bytes apiece: ~32 KiB at 8k tokens).
MAX_SCOPES = 128
# A shift must reuse at least this many tokens past the plain prefix hit to be worth a copy.
MIN_REUSED_TOKENS = 32
# The kept part is found by the first tokens after the common prefix: this many must match.
_PROBE_TOKENS = 16
_ITEM = array("i").itemsize


def scoped_key(scope: str, block_hash: bytes) -> bytes:
    """The key of an approximate block: only requests of the same scope look it up."""
    return hashlib.blake2b(
        b"shifted:" + scope.encode() + b"\0" + block_hash, digest_size=16
    ).digest()


@dataclass(frozen=True)
class Remembered:
    """A scope's last sequence: the tokens of its published blocks and the keys of those."""

    token_bytes: bytes  # array("i") of the tokens, as bytes (searched with bytes.find)
    block_keys: tuple[bytes, ...]


@dataclass(frozen=True)
class ShiftPlan:
    """Tokens ``[0, kept_end)`` are the source's own; ``[kept_end, reused_end)`` are the source's
    ``[kept_end + shift, reused_end + shift)``: their KV is copied, keys rotated back by
    ``shift``."""

    source: Remembered
    kept_end: int
    shift: int
    reused_end: int

    def source_position(self, position: int) -> int:
        return position if position < self.kept_end else position + self.shift


@dataclass(frozen=True)
class KVMove:
    """KV to copy before the next forward pass: slot ``source_slots[i]`` to
    ``destination_slots[i]``, keys rotated back by ``shift`` positions (0: a plain copy).
    ``held_block_ids`` are the source blocks kept from reuse until the copy is done."""

    source_slots: tuple[int, ...]
    destination_slots: tuple[int, ...]
    shift: int
    held_block_ids: tuple[int, ...] = ()


class ShiftMemory:
    """The last sequence of each scope, least recently used scopes forgotten first."""

    def __init__(self, max_scopes: int = MAX_SCOPES):
        self._max_scopes = max_scopes
        self._last: OrderedDict[str, Remembered] = OrderedDict()

    def remember(self, scope: str, token_ids: list[int], block_keys: list[bytes]) -> None:
        if not block_keys:
            return
        self._last[scope] = Remembered(array("i", token_ids).tobytes(), tuple(block_keys))
        self._last.move_to_end(scope)
        while len(self._last) > self._max_scopes:
            self._last.popitem(last=False)

    def last(self, scope: str) -> Remembered | None:
        return self._last.get(scope)

    def __len__(self) -> int:
        return len(self._last)


def plan_shift(token_ids: list[int], source: Remembered) -> ShiftPlan | None:
    """Where ``token_ids`` (a prompt, of which at least the last token is left to compute)
    is ``source`` with a stretch dropped: their common prefix, then the longest run that
    continues further on in ``source``. None when there is no such run worth a copy."""
    tokens = array("i", token_ids).tobytes()
    source_bytes = source.token_bytes
    kept_end = _common_prefix(tokens, source_bytes) // _ITEM
    limit = len(token_ids) - 1  # the last prompt token is always computed (its logits)
    if limit - kept_end < MIN_REUSED_TOKENS:
        return None
    probe = tokens[kept_end * _ITEM : (kept_end + _PROBE_TOKENS) * _ITEM]
    found = source_bytes.find(probe, (kept_end + 1) * _ITEM)
    while found != -1 and found % _ITEM:  # a match must start on a token boundary
        found = source_bytes.find(probe, found + 1)
    if found == -1:
        return None
    shift = found // _ITEM - kept_end
    run = _common_prefix(tokens[kept_end * _ITEM : limit * _ITEM], source_bytes[found:])
    reused_end = kept_end + run // _ITEM
    if reused_end - kept_end < MIN_REUSED_TOKENS:
        return None
    return ShiftPlan(source, kept_end, shift, reused_end)


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length in bytes of the common prefix, rounded down to whole tokens."""
    n = min(len(a), len(b))
    low, high = 0, n
    while low < high:  # binary search on slices: C-speed comparisons, log(n) of them
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low - low % _ITEM
