"""Per-request KV block bookkeeping on top of the block pool: allocation and prefix caching.

Block hashes are chained (each covers its parent's hash and its own tokens), so equal hashes mean
equal whole prefixes, not merely equal blocks.
"""

from __future__ import annotations

import hashlib
from array import array

from titan.engine.kv_cache.block_pool import BlockPool
from titan.engine.request import Request


class NoFreeBlockError(Exception):
    """A fork found no free block for its copy-on-write; nothing was changed."""


def hash_block(parent_hash: bytes, token_ids: list[int]) -> bytes:
    return hashlib.blake2b(parent_hash + array("q", token_ids).tobytes(), digest_size=16).digest()


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching)
        # request id -> how many of its leading blocks are published in the prefix cache.
        self._num_published: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _extend_hashes(self, request: Request) -> None:
        hashes = request.block_hashes
        tokens = request.all_token_ids
        size = self.block_size
        for index in range(len(hashes), len(tokens) // size):
            parent = hashes[-1] if hashes else b""
            hashes.append(hash_block(parent, tokens[index * size : (index + 1) * size]))

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids holding the longest cached prefix of the request's tokens. At least one token
        is always left to compute: the model must run to produce the next token's logits."""
        if not self.pool.enable_caching:
            return []
        self._extend_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        block_ids = []
        for block_hash in request.block_hashes[:max_blocks]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_block_ids: list[int] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more computed tokens, first adopting
        ``cached_block_ids`` (a prefix hit, only for a request that holds no blocks yet).
        Returns False, changing nothing, when the pool is too small right now."""
        cached_block_ids = cached_block_ids or []
        num_computed = request.num_computed_tokens + len(cached_block_ids) * self.block_size
        num_needed = (
            self.blocks_for(num_computed + num_new_tokens)
            - len(request.block_ids)
            - len(cached_block_ids)
        )
        # Hits on free (evictable) cached blocks take those blocks out of the free list too.
        num_revived = sum(self.pool.blocks[b].ref_cnt == 0 for b in cached_block_ids)
        if num_needed > self.pool.num_free_blocks - num_revived:
            return False
        if cached_block_ids:
            self.pool.share(cached_block_ids)
            request.block_ids.extend(cached_block_ids)
            self._num_published[request.request_id] = len(cached_block_ids)
        if num_needed > 0:
            request.block_ids.extend(self.pool.allocate(num_needed))
        self._publish_full_blocks(request, num_computed + num_new_tokens)
        return True

    def _publish_full_blocks(self, request: Request, num_tokens_after_step: int) -> None:
        """Publish blocks that are full once this step's tokens are written. Their KV is written
        before any attention in the same forward pass, so a same-step hit reads valid data."""
        if not self.pool.enable_caching:
            return
        num_full = num_tokens_after_step // self.block_size
        start = self._num_published.get(request.request_id, 0)
        if num_full <= start:
            return
        self._extend_hashes(request)
        for index in range(start, num_full):
            self.pool.cache(request.block_ids[index], request.block_hashes[index])
        self._num_published[request.request_id] = num_full

    def fork(self, parent: Request, child: Request, num_tokens: int) -> tuple[int, int] | None:
        """Give ``child`` (holding no blocks) the KV of ``parent``'s first ``num_tokens`` tokens,
        which must be computed: full blocks are shared (ref counts), the last, partly filled
        block is copied (copy-on-write: the child will write into it). Returns the
        (source, destination) block pair the caller must copy before the next forward pass, or
        None when nothing is copied. Raises NoFreeBlockError, changing nothing, when the copy
        has no free block."""
        num_full = num_tokens // self.block_size
        has_partial = num_tokens % self.block_size != 0
        if has_partial and self.pool.num_free_blocks < 1:
            raise NoFreeBlockError("no free block for the copy-on-write of a forked sequence")
        shared = parent.block_ids[:num_full]
        self.pool.share(shared)
        child.block_ids = list(shared)
        copy = None
        if has_partial:
            (destination,) = self.pool.allocate(1)
            child.block_ids.append(destination)
            copy = (parent.block_ids[num_full], destination)
        # The shared full blocks were published (or not) by the parent: never publish them twice.
        self._num_published[child.request_id] = num_full
        child.num_computed_tokens = num_tokens
        return copy

    def free(self, request: Request) -> None:
        self.pool.release(list(reversed(request.block_ids)))
        request.block_ids = []
        self._num_published.pop(request.request_id, None)
