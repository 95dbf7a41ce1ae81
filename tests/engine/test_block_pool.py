import pytest

from titan.engine.kv_cache.block_pool import BlockPool


def test_allocate_and_release_restore_the_free_count():
    pool = BlockPool(8)
    ids = pool.allocate(5)
    assert len(set(ids)) == 5
    assert pool.num_free_blocks == 3
    pool.release(ids)
    assert pool.num_free_blocks == 8
    pool.check_invariants()


def test_allocating_more_than_free_raises():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError):
        pool.allocate(3)


def test_double_free_is_detected():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.release([block])
    with pytest.raises(RuntimeError, match="double free"):
        pool.release([block])


def test_free_list_is_lru_least_recently_freed_first():
    pool = BlockPool(4)
    a, b, c, d = pool.allocate(4)
    pool.release([c])
    pool.release([a])
    pool.release([d, b])
    assert pool.allocate(4) == [c, a, d, b]


def test_cached_block_survives_release_until_reused():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.cache(block, b"h1")
    pool.release([block])
    assert pool.lookup(b"h1") == block  # still findable while free
    pool.share([block])  # a prefix hit revives it
    assert pool.num_free_blocks == 1
    pool.release([block])
    # Reusing every block evicts the cached one.
    pool.allocate(2)
    assert pool.lookup(b"h1") is None
    assert pool.num_evictions == 1
    pool.check_invariants()


def test_shared_block_needs_every_reference_released():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.cache(block, b"h")
    pool.share([block])
    pool.release([block])
    assert pool.num_free_blocks == 1
    pool.release([block])
    assert pool.num_free_blocks == 2


def test_first_cached_copy_wins():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, b"same")
    pool.cache(b, b"same")
    assert pool.lookup(b"same") == a
    pool.check_invariants()


def test_caching_disabled_never_finds_blocks():
    pool = BlockPool(2, enable_caching=False)
    (block,) = pool.allocate(1)
    pool.cache(block, b"h")
    assert pool.lookup(b"h") is None
