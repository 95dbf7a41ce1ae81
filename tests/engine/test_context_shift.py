"""Context shift, no model: where a prompt drops a stretch of its scope's last sequence, and how
the scheduler and KV manager reuse that sequence's blocks for what was kept."""

from __future__ import annotations

from array import array

from tests.engine.test_scheduler import make_scheduler, run_to_completion
from titan.engine.kv_cache.context_shift import (
    MIN_REUSED_TOKENS,
    Remembered,
    ShiftMemory,
    plan_shift,
)
from titan.engine.request import Request
from titan.engine.sampling_params import SamplingParams

BLOCK = 4


def remembered(tokens: list[int]) -> Remembered:
    return Remembered(array("i", tokens).tobytes(), tuple(b"k%d" % i for i in range(len(tokens))))


def test_a_dropped_stretch_is_found_after_the_common_prefix():
    system, dropped, kept = list(range(1, 11)), list(range(500, 560)), list(range(1000, 1100))
    source = remembered(system + dropped + kept)
    plan = plan_shift(system + kept + [7, 7, 7], source)
    assert plan is not None
    assert (plan.kept_end, plan.shift, plan.reused_end) == (10, 60, 110)
    assert plan.source_position(9) == 9 and plan.source_position(10) == 70


def test_the_last_prompt_token_is_never_reused():
    system, dropped, kept = list(range(1, 11)), list(range(500, 560)), list(range(1000, 1100))
    plan = plan_shift(system + kept, remembered(system + dropped + kept))
    assert plan is not None and plan.reused_end == len(system + kept) - 1


def test_no_plan_without_a_drop_or_with_too_little_to_reuse():
    tokens = list(range(1, 200))
    assert plan_shift([*tokens, 5, 6, 7], remembered(tokens)) is None  # a plain extension
    assert plan_shift([1, 2, 3, *list(range(900, 1000))], remembered(tokens)) is None  # unrelated
    short = list(range(1, 11)) + list(range(20, 20 + MIN_REUSED_TOKENS - 1)) + [0]
    assert plan_shift(short, remembered(list(range(1, 60)))) is None


def test_a_match_must_start_on_a_token_boundary():
    # Token 256 is bytes 00 01 00 00: the probe's bytes occur at an odd offset in a source whose
    # tokens never contain it, which must not count as a match.
    source = remembered([1, 2, 3] + [0x01000000, 0x00000100] * 40)
    assert plan_shift([1, 2, 3] + [0x00000001] * 40, source) is None


def test_the_memory_forgets_the_least_recently_used_scope():
    memory = ShiftMemory(max_scopes=2)
    for scope in "abc":
        memory.remember(scope, [1, 2, 3, 4], [b"k"])
    assert memory.last("a") is None and memory.last("c") is not None and len(memory) == 2


def scoped(rid: str, tokens: list[int], scope: str | None, max_tokens: int = 2) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return Request(rid, tokens, params, shift_scope=scope)


def conversation() -> tuple[list[int], list[int], list[int]]:
    """System prompt, a dropped stretch and a kept one: 128 tokens, 32 full blocks."""
    return list(range(100, 110)), list(range(300, 340)), list(range(600, 678))


def test_a_trimmed_prompt_reuses_the_kept_tokens_with_their_keys_moved():
    scheduler = make_scheduler(num_blocks=128, block_size=BLOCK, budget=512)
    system, dropped, kept = conversation()
    first = scoped("r1", system + dropped + kept, "conv")
    scheduler.add_request(first)
    run_to_completion(scheduler)
    source_blocks = {
        index: scheduler.kv.pool.lookup(key)
        for index, key in enumerate(scheduler.kv.shift_memory.last("conv").block_keys)
    }

    second = scoped("r2", system + kept + [900, 901, 902], "conv")
    scheduler.add_request(second)
    output = scheduler.schedule()
    (item,) = output.scheduled
    # The system prompt's first two blocks are a plain prefix hit; positions 8..87 are copied.
    assert item.start == len(system + kept) and item.num_new_tokens == 3
    assert [m.shift for m in output.kv_moves] == [0, len(dropped)]
    unshifted, shifted = output.kv_moves
    slot = second.block_ids
    assert unshifted.destination_slots[0] == slot[2] * BLOCK  # position 8
    assert unshifted.source_slots[0] == source_blocks[2] * BLOCK
    assert shifted.destination_slots[0] == slot[2] * BLOCK + 2  # position 10 (first kept)
    source_position = 10 + len(dropped)
    assert shifted.source_slots[0] == (
        source_blocks[source_position // BLOCK] * BLOCK + source_position % BLOCK
    )
    assert second.num_cached_tokens == len(system + kept)
    assert second.first_approximate_block == 2
    scheduler.kv.release_moved(output.kv_moves)
    scheduler.update(output, {"r2": 7})
    run_to_completion(scheduler)
    scheduler.kv.pool.check_invariants()
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_total_blocks


def test_shifted_blocks_are_only_served_to_their_own_scope():
    scheduler = make_scheduler(num_blocks=128, block_size=BLOCK, budget=512)
    system, dropped, kept = conversation()
    scheduler.add_request(scoped("r1", system + dropped + kept, "conv"))
    run_to_completion(scheduler)
    trimmed = system + kept + [900, 901, 902]
    scheduler.add_request(scoped("r2", trimmed, "conv"))
    output = scheduler.schedule()
    scheduler.kv.release_moved(output.kv_moves)
    scheduler.update(output, {"r2": 7})
    run_to_completion(scheduler)

    # r2 computed its prompt and its first output token (7): 92 tokens, 23 blocks.
    longer = [*trimmed, 7, 7, 7]
    assert len(scheduler.kv.find_cached_prefix(scoped("r3", longer, "conv"))) == 23
    for other in (scoped("r4", longer, None), scoped("r5", longer, "other")):
        # Exact blocks only: the first two (the system prompt), before the copied ones.
        assert len(scheduler.kv.find_cached_prefix(other)) == 2
        assert scheduler.kv.plan_shift(other, []) is None


def test_no_shift_once_the_source_blocks_are_evicted():
    scheduler = make_scheduler(num_blocks=40, block_size=BLOCK, budget=512)
    system, dropped, kept = conversation()
    scheduler.add_request(scoped("r1", system + dropped + kept, "conv"))
    run_to_completion(scheduler)
    # Unrelated work takes every free block: the conversation's cached blocks are reused.
    scheduler.add_request(scoped("filler", list(range(2000, 2150)), None, max_tokens=1))
    run_to_completion(scheduler)
    request = scoped("r2", system + kept + [900, 901, 902], "conv")
    assert scheduler.kv.plan_shift(request, scheduler.kv.find_cached_prefix(request)) is None
    scheduler.add_request(request)
    output = scheduler.schedule()
    # Only the system prompt's first two blocks were left: a plain prefix hit.
    assert not output.kv_moves and output.scheduled[0].start == 2 * BLOCK
