"""Per-request KV block bookkeeping on top of the block pool: allocation and prefix caching.

Block hashes are chained (each covers its parent's hash and its own tokens), so equal hashes mean
equal whole prefixes, not merely equal blocks. A block whose KV is approximate (context shift,
context_shift.py) is published under its hash salted with the request's scope instead.
"""

from __future__ import annotations

import hashlib
from array import array

from titan.engine.kv_cache.block_pool import BlockPool
from titan.engine.kv_cache.context_shift import (
    MIN_REUSED_TOKENS,
    KVMove,
    ShiftMemory,
    ShiftPlan,
    plan_shift,
    scoped_key,
)
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
        self.shift_memory = ShiftMemory()

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

    def _key(self, request: Request, index: int) -> bytes:
        """The key block ``index`` of ``request`` is published and remembered under."""
        block_hash = request.block_hashes[index]
        first = request.first_approximate_block
        if first is None or index < first or request.shift_scope is None:
            return block_hash
        return scoped_key(request.shift_scope, block_hash)

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids holding the longest cached prefix of the request's tokens. At least one token
        is always left to compute: the model must run to produce the next token's logits. A
        request with a shift scope also takes its scope's approximate blocks (and is then
        approximate from there on: its own blocks are published under scoped keys too)."""
        if not self.pool.enable_caching:
            return []
        self._extend_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        scope = request.shift_scope
        block_ids = []
        for index, block_hash in enumerate(request.block_hashes[:max_blocks]):
            block_id = self.pool.lookup(block_hash)
            if block_id is None and scope is not None:
                block_id = self.pool.lookup(scoped_key(scope, block_hash))
                if block_id is not None and request.first_approximate_block is None:
                    request.first_approximate_block = index
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    # ---- context shift ----------------------------------------------------------------------

    def plan_shift(self, request: Request, cached_block_ids: list[int]) -> ShiftPlan | None:
        """How ``request`` (holding no blocks) can reuse its scope's last sequence past its plain
        prefix hit, cut short where that sequence's blocks were evicted. None: it cannot."""
        source = self.shift_memory.last(request.shift_scope) if request.shift_scope else None
        if source is None or not self.pool.enable_caching:
            return None
        plan = plan_shift(request.all_token_ids[: request.num_prompt_tokens], source)
        start = len(cached_block_ids) * self.block_size
        if plan is None or plan.reused_end - start < MIN_REUSED_TOKENS:
            return None
        size = self.block_size
        position = start
        while position < plan.reused_end:
            source_position = plan.source_position(position)
            if self.pool.lookup(source.block_keys[source_position // size]) is None:
                break
            end = position + size - source_position % size
            position = min(end, plan.kept_end) if position < plan.kept_end else end
        reused_end = min(position, plan.reused_end)
        if reused_end - start < MIN_REUSED_TOKENS:
            return None
        return ShiftPlan(source, plan.kept_end, plan.shift, reused_end)

    def adopt_shifted(
        self, request: Request, cached_block_ids: list[int], plan: ShiftPlan, num_new_tokens: int
    ) -> list[KVMove] | None:
        """Give ``request`` (holding no blocks) its prefix hit, blocks for the plan's reused
        tokens and ``num_new_tokens`` more, and the moves that fill the reused ones from the
        source's blocks (each move holds its source blocks until the caller has run it and
        called ``release_moved``). None, changing nothing, when the pool is too small now."""
        size = self.block_size
        start = len(cached_block_ids) * size
        segments = [
            (start, min(plan.kept_end, plan.reused_end), 0),
            (max(start, plan.kept_end), plan.reused_end, plan.shift),
        ]
        segments = [(first, end, shift) for first, end, shift in segments if first < end]
        source_ids = {  # source block index -> block id
            index: self.pool.lookup(plan.source.block_keys[index])
            for first, end, shift in segments
            for index in range((first + shift) // size, (end - 1 + shift) // size + 1)
        }
        num_needed = self.blocks_for(plan.reused_end + num_new_tokens) - len(cached_block_ids)
        taken = {*cached_block_ids, *source_ids.values()}
        num_revived = sum(self.pool.blocks[b].ref_cnt == 0 for b in taken)
        if num_needed > self.pool.num_free_blocks - num_revived:
            return None
        self.pool.share(cached_block_ids)
        # Each move holds its own source blocks (a block two moves read is shared twice): kept
        # from eviction by the allocation below until the move has run.
        held = [
            tuple(dict.fromkeys(source_ids[(q + shift) // size] for q in range(first, end)))
            for first, end, shift in segments
        ]
        for block_ids in held:
            self.pool.share(list(block_ids))
        request.block_ids = [*cached_block_ids, *self.pool.allocate(num_needed)]
        self._num_published[request.request_id] = len(cached_block_ids)
        if request.first_approximate_block is None:
            request.first_approximate_block = len(cached_block_ids)
        moves = []
        for (first, end, shift), block_ids in zip(segments, held, strict=True):
            positions = range(first, end)
            moves.append(
                KVMove(
                    tuple(source_ids[(q + shift) // size] * size + (q + shift) % size
                          for q in positions),
                    tuple(request.block_ids[q // size] * size + q % size for q in positions),
                    shift,
                    block_ids,
                )
            )  # fmt: skip
        self._publish_full_blocks(request, plan.reused_end + num_new_tokens)
        return moves

    def release_moved(self, moves: list[KVMove]) -> None:
        for move in moves:
            self.pool.release(list(move.held_block_ids))

    def remember(self, request: Request) -> None:
        """Keep a scoped request's published blocks as its scope's source for the next shift."""
        if request.shift_scope is None:
            return
        num_published = self._num_published.get(request.request_id, 0)
        keys = [self._key(request, index) for index in range(num_published)]
        tokens = request.all_token_ids[: num_published * self.block_size]
        self.shift_memory.remember(request.shift_scope, tokens, keys)

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
            self.pool.cache(request.block_ids[index], self._key(request, index))
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
