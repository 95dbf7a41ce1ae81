"""The prefix index: chained block hashes, hits counted from the first block, LRU aging and each
deployment's capacity."""

from __future__ import annotations

from titan.router.prefix_index import PrefixIndex, block_hashes

SYSTEM = "You are a careful assistant. " * 40  # 1,160 chars: 4 full 256-char blocks


def test_blocks_are_chained_so_equal_hashes_mean_equal_prefixes():
    a = block_hashes(SYSTEM + "What is the capital of France?", 256)
    b = block_hashes(SYSTEM + "Name three rivers in Spain, please.", 256)
    assert len(a) == 4 and a == b[:4]  # the question is in the partial last block
    changed = block_hashes("X" + SYSTEM[1:], 256)
    assert not set(changed) & set(a)  # one changed character changes every later block
    assert block_hashes("short", 256) == ()
    assert len(block_hashes("é" * 512, 256)) == 2  # characters, not bytes


def test_score_is_the_share_of_leading_blocks_held():
    index = PrefixIndex({"a": 100, "b": 100})
    shared = block_hashes(SYSTEM, 256)
    index.record("a", shared)
    longer = block_hashes(SYSTEM + "Q" * 1024, 256)  # 4 shared blocks + 4 new ones
    assert index.score("a", longer) == 0.5
    assert index.score("b", longer) == 0.0
    assert index.score("a", ()) == 0.0
    assert index.score("unknown", longer) == 0.0
    # A block after a miss does not count: the prefix cache needs the blocks before it.
    index.record("b", longer[1:])
    assert index.score("b", longer) == 0.0


def test_capacity_evicts_the_least_recently_routed_blocks_tail_first():
    index = PrefixIndex({"a": 6})
    old = block_hashes("o" * 1024, 256)  # 4 blocks
    new = block_hashes("n" * 1024, 256)
    index.record("a", old)
    index.record("a", new)  # 8 blocks for 6 places: two of old's go
    assert index.num_blocks("a") == 6
    assert index.score("a", new) == 1.0
    # Its tail went first (as vLLM frees a request's blocks): its prefix still matches.
    assert index.score("a", old) == 0.5


def test_routing_again_refreshes_a_prefix_so_it_outlives_newer_ones():
    index = PrefixIndex({"a": 8})
    system, other = block_hashes("s" * 1024, 256), block_hashes("o" * 1024, 256)
    index.record("a", system)
    index.record("a", other)
    index.record("a", system)  # used again: the most recent now
    index.record("a", block_hashes("t" * 1024, 256))  # evicts `other`, the least recent
    assert index.score("a", system) == 1.0
    assert index.score("a", other) == 0.0
    index.forget("a")
    assert index.num_blocks("a") == 0 and index.score("a", system) == 0.0
