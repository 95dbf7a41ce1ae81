"""The simulated KV cache: tokens and chained block hashes of a prompt, and the block pool."""

from __future__ import annotations

from titan.simulate.kv_blocks import BlockPool, render_prompt, tokenize


def test_tokens_are_four_bytes_and_hashes_chain_over_whole_prefixes():
    first = tokenize(b"a" * 64 + b"b" * 64 + b"c" * 10, block_size=16)
    assert first.num_tokens == 35 and len(first.block_hashes) == 2  # the tail is not a block
    # The same second block after a different first one hashes differently: a hash is a prefix.
    other = tokenize(b"z" * 64 + b"b" * 64, block_size=16)
    assert other.block_hashes[1] != first.block_hashes[1]
    same_start = tokenize(b"a" * 64 + b"q" * 64, block_size=16)
    assert same_start.block_hashes[0] == first.block_hashes[0]
    assert tokenize(b"", block_size=16).num_tokens == 1


def test_chats_sharing_their_first_turns_share_a_rendered_prefix():
    system = {"role": "system", "content": "You are terse. " * 20}
    one = render_prompt({"messages": [system, {"role": "user", "content": "Hi"}]})
    two = render_prompt({"messages": [system, {"role": "user", "content": "Bye"}]})
    assert one.startswith(render_prompt({"messages": [system]})) and one != two
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert render_prompt(parts) == b"<|user|>Hi\n"
    assert render_prompt({"prompt": "Once upon"}) == b"Once upon"


def test_a_cached_prefix_is_found_until_pressure_evicts_the_least_recently_freed():
    pool = BlockPool(4)
    first = pool.allocate(2)
    assert first is not None and pool.usage == 0.5
    pool.publish(first[0], b"h0")
    pool.publish(first[1], b"h1")
    pool.free(first)
    assert pool.usage == 0.0 and pool.num_free == 4
    assert pool.cached_prefix([b"h0", b"h1", b"h2"], max_blocks=8) == first
    pool.free(first)
    # Freed tail first: h1's block is evicted before h0's, which more prompts share.
    taken = pool.allocate(3)
    assert taken is not None and pool.num_evictions == 1
    assert pool.cached_prefix([b"h0", b"h1"], max_blocks=8) == [first[0]]
    assert pool.allocate(1) is None  # every block is held
