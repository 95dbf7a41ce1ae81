"""The KV block pool: reference counts, an LRU free list and the prefix-cache hash table.

Pure Python. A block is *free* when no request holds it (ref_cnt == 0). A free block may still
hold a cached prefix (it has a hash): it stays findable until it is handed out again, and the LRU
free list makes the least recently freed block the first to be reused.
"""

from __future__ import annotations

from collections import OrderedDict


class KVBlock:
    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> None, ordered from least to most recently freed.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, int] = {}  # block hash -> block id
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` free blocks, least recently freed first (evicting their cache)."""
        if num_blocks > len(self._free):
            raise RuntimeError(
                f"asked for {num_blocks} blocks with {len(self._free)} free; "
                "callers must check num_free_blocks first"
            )
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_cnt = 1
            block_ids.append(block_id)
        return block_ids

    def lookup(self, block_hash: bytes) -> int | None:
        if not self.enable_caching:
            return None
        return self._cached.get(block_hash)

    def share(self, block_ids: list[int]) -> None:
        """Take a reference on cached blocks (a prefix-cache hit); free ones leave the free list."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self._free[block_id]
            block.ref_cnt += 1

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference per block. Callers pass a request's blocks in reverse order so that
        the tail of a sequence (the least shareable part) is reused first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block_id] = None

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Publish a full block under its chained hash. A block whose contents are already cached
        under another id stays private (the first copy wins)."""
        if not self.enable_caching:
            return
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block_id

    def check_invariants(self) -> None:
        for block in self.blocks:
            in_free = block.block_id in self._free
            if (block.ref_cnt == 0) != in_free:
                raise AssertionError(f"{block} free-list membership disagrees with its ref count")
            if block.ref_cnt < 0:
                raise AssertionError(f"{block} has a negative ref count")
            if (
                block.block_hash is not None
                and self._cached.get(block.block_hash) != block.block_id
            ):
                raise AssertionError(f"{block} has a hash the table does not map back to it")
        if len(self._cached) != sum(b.block_hash is not None for b in self.blocks):
            raise AssertionError("hash table size disagrees with the hashed blocks")
