"""Forking KV blocks (n > 1, beam search) in the scheduler and KV manager: pure Python, no model."""

from __future__ import annotations

import pytest

from titan.engine.kv_cache.manager import KVCacheManager, NoFreeBlockError
from titan.engine.request import Request, RequestStatus
from titan.engine.sampling_params import SamplingParams
from titan.engine.scheduler import Scheduler, SchedulerConfig

BLOCK = 4


def make_scheduler(num_blocks: int = 32) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    return Scheduler(config, KVCacheManager(num_blocks, BLOCK))


def make_request(rid: str, prompt: list[int], seq: int = 0) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=8), arrival_seq=seq, eos_token_ids=(2,))


def run_step(scheduler: Scheduler) -> list:
    output = scheduler.schedule()
    sampled = {s.request.request_id: 50 for s in output.scheduled if s.samples}
    scheduler.update(output, sampled)
    return output


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    kv = KVCacheManager(16, BLOCK)
    parent = make_request("p", list(range(10, 20)))  # 10 tokens: 2 full blocks + 2 tokens
    assert kv.allocate_slots(parent, 10)
    parent.num_computed_tokens = 10
    child = make_request("c", list(range(10, 20)))
    copy = kv.fork(parent, child, 9)
    assert child.block_ids[:2] == parent.block_ids[:2]
    assert (
        copy == (parent.block_ids[2], child.block_ids[2])
        and child.block_ids[2] not in parent.block_ids
    )
    assert [kv.pool.blocks[b].ref_cnt for b in parent.block_ids] == [2, 2, 1]
    assert child.num_computed_tokens == 9
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 16
    kv.pool.check_invariants()


def test_fork_on_a_block_boundary_copies_nothing_and_a_full_pool_changes_nothing():
    kv = KVCacheManager(3, BLOCK)
    parent = make_request("p", list(range(10, 22)))  # 12 tokens: 3 full blocks, pool full
    assert kv.allocate_slots(parent, 12)
    parent.num_computed_tokens = 12
    assert kv.fork(parent, make_request("a", list(range(10, 22))), 8) is None
    with pytest.raises(NoFreeBlockError):
        kv.fork(parent, make_request("b", list(range(10, 22))), 10)
    assert [kv.pool.blocks[b].ref_cnt for b in parent.block_ids] == [2, 2, 1]


def test_children_wait_for_the_prompt_then_fork_it():
    scheduler = make_scheduler()
    prompt = list(range(10, 20))
    leader = make_request("g-0", prompt, 0)
    scheduler.add_request(leader)
    children = []
    for i in (1, 2):
        child = make_request(f"g-{i}", prompt, i)
        child.share_prompt_with = "g-0"
        scheduler.add_request(child)
        children.append(child)
    first = run_step(scheduler)
    assert [s.request.request_id for s in first.scheduled] == ["g-0"]  # children held
    second = run_step(scheduler)
    forked = {s.request.request_id: (s.start, s.num_new_tokens) for s in second.scheduled}
    assert forked == {"g-0": (10, 1), "g-1": (9, 1), "g-2": (9, 1)}
    assert len(second.block_copies) == 2  # each child copied the partial third block
    for child in children:
        assert child.block_ids[:2] == leader.block_ids[:2]
        assert child.num_cached_tokens == 9
    for request_id in ("g-0", "g-1", "g-2"):
        scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_total_blocks


def test_a_child_whose_sibling_is_gone_is_admitted_normally():
    scheduler = make_scheduler()
    prompt = list(range(10, 20))
    scheduler.add_request(make_request("g-0", prompt, 0))
    child = make_request("g-1", prompt, 1)
    child.share_prompt_with = "g-0"
    scheduler.add_request(child)
    run_step(scheduler)
    scheduler.finish_request("g-0", RequestStatus.FINISHED_ABORTED)
    output = run_step(scheduler)
    # The prefix cache still serves the prompt's full blocks (8 tokens); no fork, no copy.
    assert [(s.request.request_id, s.start) for s in output.scheduled] == [("g-1", 8)]
    assert not output.block_copies and child.share_prompt_with is None
