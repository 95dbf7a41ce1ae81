"""Which deployment probably holds which prompt prefix, from Titan's own routing history (as
llm-d's approximate prefix-cache scorer does, over characters since the gateway has no upstream
tokenizer).

A prompt is cut into blocks of ``block_chars`` characters; each block's hash covers every block
before it, so one equal hash means one equal whole prefix, as in vLLM's own prefix cache. Each
deployment keeps an LRU of the hashes routed to it, at most its cache's size in blocks: the
oldest fall out as its model server would evict them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(text: str, block_chars: int) -> tuple[int, ...]:
    """The chained hashes of the text's full blocks (a partial last block is never cached)."""
    hashes: list[int] = []
    parent = b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        hashes.append(int.from_bytes(parent, "big"))
    return tuple(hashes)


class PrefixIndex:
    """One model's index: deployment name → its recently routed block hashes, oldest first."""

    def __init__(self, capacities: dict[str, int]):
        self.capacities = dict(capacities)
        self._blocks: dict[str, OrderedDict[int, None]] = {
            name: OrderedDict() for name in capacities
        }

    def score(self, deployment: str, hashes: Sequence[int]) -> float:
        """The share of the prompt's blocks the deployment holds, counted from the first: a
        block after a miss is useless to a prefix cache."""
        if not hashes:
            return 0.0
        held = self._blocks.get(deployment)
        if not held:
            return 0.0
        matched = 0
        for value in hashes:
            if value not in held:
                break
            matched += 1
        return matched / len(hashes)

    def record(self, deployment: str, hashes: Sequence[int]) -> None:
        """The deployment was routed a prompt with these blocks: it holds them now, as its most
        recently used ones. The first block ends up the newest, so eviction takes a prompt's
        tail first (as vLLM frees a request's blocks) and its prefix keeps matching."""
        held = self._blocks.get(deployment)
        if held is None:
            return
        for value in reversed(hashes):
            held[value] = None
            held.move_to_end(value)
        overflow = len(held) - self.capacities[deployment]
        for _ in range(max(0, overflow)):
            held.popitem(last=False)

    def forget(self, deployment: str) -> None:
        """Its cache is gone (a restart): nothing is held any more."""
        if deployment in self._blocks:
            self._blocks[deployment].clear()

    def num_blocks(self, deployment: str) -> int:
        return len(self._blocks.get(deployment, ()))
