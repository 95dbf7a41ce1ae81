"""The simulated model server's KV cache: a prompt's tokens and block hashes, and a block pool
with prefix caching (ref counts, an LRU free list, a table of published block hashes).

The rules are the embedded engine's (and vLLM's): chained hashes, so that equal hashes mean equal
whole prefixes; a free block keeps its hash until it is reused, so a finished request's prefix
stays findable until pressure evicts it, least recently freed first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A token is 4 bytes of the rendered prompt: the same estimate as the usage counts
# (titan.simulate.wire), and deterministic, which is all prefix caching needs.
BYTES_PER_TOKEN = 4


def render_prompt(body: Mapping[str, Any]) -> bytes:
    """The prompt as one byte string, as a chat template would lay it out (roles and turns in
    order), so that two requests sharing their first turns share a prefix."""
    if "messages" in body:
        parts = []
        for message in body["messages"] if isinstance(body["messages"], list) else []:
            if isinstance(message, dict):
                role = message.get("role")
                parts.append(f"<|{role}|>{_text(message.get('content'))}\n")
        return "".join(parts).encode()
    return _text(body.get("prompt")).encode()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts, or token ids
        return "".join(
            _text(item) if not isinstance(item, int) else f"{item:08x}" for item in value
        )
    if isinstance(value, dict):
        return _text(value.get("text"))
    return ""


@dataclass(frozen=True, slots=True)
class PromptTokens:
    num_tokens: int
    block_hashes: tuple[bytes, ...]  # one per full block, chained


def tokenize(prompt: bytes, block_size: int) -> PromptTokens:
    num_tokens = max(1, -(-len(prompt) // BYTES_PER_TOKEN))
    block_bytes = block_size * BYTES_PER_TOKEN
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, (len(prompt) // block_bytes) * block_bytes, block_bytes):
        parent = hashlib.blake2b(
            parent + prompt[start : start + block_bytes], digest_size=16
        ).digest()
        hashes.append(parent)
    return PromptTokens(num_tokens, tuple(hashes))


class BlockPool:
    """``num_blocks`` blocks. Invariant: a block is either held (ref count > 0) or in the free
    list, never both; the free list's front is evicted first."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self.num_evictions = 0  # cached blocks reused for other tokens

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Held blocks over all blocks (cached but free ones do not count, as in vLLM)."""
        return self.num_used / self.num_blocks

    def cached_prefix(self, hashes: Sequence[bytes], max_blocks: int) -> list[int]:
        """Takes (ref + 1) the blocks holding the longest cached prefix, up to ``max_blocks``."""
        found: list[int] = []
        for block_hash in hashes[:max_blocks]:
            block = self._block_of.get(block_hash)
            if block is None:
                break
            self._take(block)
            found.append(block)
        return found

    def allocate(self, num: int) -> list[int] | None:
        """``num`` fresh blocks (evicting the least recently freed), or None if too few."""
        if num > len(self._free):
            return None
        blocks = []
        for _ in range(num):
            block, _ = self._free.popitem(last=False)
            old_hash = self._hash_of.pop(block, None)
            if old_hash is not None:
                del self._block_of[old_hash]
                self.num_evictions += 1
            self._ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def publish(self, block: int, block_hash: bytes) -> None:
        """The block now holds a full prompt block whose chained hash is ``block_hash``."""
        if block_hash in self._block_of or block in self._hash_of:
            return  # computed twice at once (the same prefix in one step): one copy is findable
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def free(self, blocks: Sequence[int]) -> None:
        # Tail first: a prompt's last blocks are evicted before its first ones, which more
        # requests share.
        for block in reversed(blocks):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                self._free[block] = None

    def _take(self, block: int) -> None:
        if self._ref_counts[block] == 0:
            del self._free[block]
        self._ref_counts[block] += 1
