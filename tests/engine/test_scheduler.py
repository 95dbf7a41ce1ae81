"""Scheduler and KV manager: pure Python, no model. A fake runner samples a fixed token."""

from __future__ import annotations

import pytest

from titan.engine.kv_cache.manager import KVCacheManager
from titan.engine.request import Request, RequestStatus
from titan.engine.sampling_params import SamplingParams
from titan.engine.scheduler import Scheduler, SchedulerConfig

EOS = 2


def make_scheduler(
    num_blocks=64,
    block_size=4,
    max_num_seqs=8,
    budget=32,
    max_model_len=1024,
    chunk_cap=None,
    cost_model=None,
    max_decode_slowdown=None,
):
    kv = KVCacheManager(num_blocks, block_size)
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        max_prefill_chunk_while_decoding=chunk_cap,
        max_decode_slowdown=max_decode_slowdown,
        min_prefill_chunk=4,
    )
    return Scheduler(config, kv, cost_model)


_seq = iter(range(10**9))


def make_request(rid, num_prompt, max_tokens=4, priority=0, first_token=10, **params):
    tokens = [first_token + i for i in range(num_prompt)]
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=max_tokens, temperature=0, **params),
        priority=priority,
        arrival_seq=next(_seq),
        eos_token_ids=(EOS,),
    )


def run_step(scheduler, token=7):
    out = scheduler.schedule()
    sampled = {s.request.request_id: token for s in out.scheduled if s.samples}
    scheduler.update(out, sampled)
    return out


def run_to_completion(scheduler, max_steps=1000):
    outputs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished:
            return outputs
        outputs.append(run_step(scheduler))
    raise AssertionError("did not finish")


def test_prefill_then_decode_until_max_tokens():
    s = make_scheduler()
    req = make_request("a", 10, max_tokens=3)
    s.add_request(req)
    out = run_step(s)
    assert [(x.num_new_tokens, x.start) for x in out.scheduled] == [(10, 0)]
    assert req.num_output_tokens == 1
    run_to_completion(s)
    assert req.status == RequestStatus.FINISHED_LENGTH
    assert req.num_output_tokens == 3
    assert s.kv.num_free_blocks == 64


def test_long_prompt_is_chunked_under_the_token_budget():
    s = make_scheduler(budget=8)
    req = make_request("a", 20)
    s.add_request(req)
    sizes = [run_step(s).scheduled[0].num_new_tokens for _ in range(3)]
    assert sizes == [8, 8, 4]
    assert req.num_output_tokens == 1  # sampled only once the whole prompt was computed


def test_running_decodes_are_scheduled_before_a_new_long_prompt():
    s = make_scheduler(budget=16, chunk_cap=4)
    decoders = [make_request(f"d{i}", 4, max_tokens=50) for i in range(3)]
    for r in decoders:
        s.add_request(r)
    run_step(s)
    long = make_request("long", 100, max_tokens=2)
    s.add_request(long)
    out = run_step(s)
    by_id = {x.request.request_id: x.num_new_tokens for x in out.scheduled}
    assert by_id == {"d0": 1, "d1": 1, "d2": 1, "long": 4}  # capped chunk while decoding


def test_max_num_seqs_caps_the_running_set():
    s = make_scheduler(max_num_seqs=2)
    for i in range(4):
        s.add_request(make_request(f"r{i}", 3))
    out = s.schedule()
    assert len(out.scheduled) == 2
    assert len(s.waiting) == 2


def test_priority_classes_then_fcfs():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("low", 3, priority=5))
    s.add_request(make_request("high-1", 3, priority=0))
    s.add_request(make_request("high-2", 3, priority=0))
    order = []
    for _ in range(100):
        out = run_step(s)
        for x in out.scheduled:
            if x.start == 0:
                order.append(x.request.request_id)
        if not s.has_unfinished:
            break
    assert order == ["high-1", "high-2", "low"]


def test_preemption_picks_lowest_priority_then_least_computed_and_recomputes():
    # 6 blocks of 4 tokens: two 8-token prompts fill 4 blocks, decode growth forces preemption.
    s = make_scheduler(num_blocks=6, block_size=4, budget=64)
    important = make_request("important", 8, max_tokens=12, priority=0)
    background = make_request("background", 8, max_tokens=12, priority=1)
    s.add_request(important)
    s.add_request(background)
    preempted = []
    for _ in range(200):
        out = run_step(s)
        preempted += out.preempted_ids
        if not s.has_unfinished:
            break
    assert preempted and set(preempted) == {"background"}
    assert background.num_preemptions >= 1
    assert important.status == background.status == RequestStatus.FINISHED_LENGTH
    assert important.num_output_tokens == background.num_output_tokens == 12
    assert s.kv.num_free_blocks == 6


def test_victim_among_equals_is_the_least_computed():
    s = make_scheduler(num_blocks=5, block_size=4, budget=64)
    big = make_request("big", 12, max_tokens=8)
    small = make_request("small", 4, max_tokens=8)
    s.add_request(big)
    s.add_request(small)
    preempted = []
    for _ in range(100):
        preempted += run_step(s).preempted_ids
        if preempted:
            break
    assert preempted[0] == "small"


def test_eos_stops_unless_ignore_eos_and_min_tokens_delays_it():
    s = make_scheduler()
    stops = make_request("stops", 4, max_tokens=10)
    ignores = make_request("ignores", 4, max_tokens=5, ignore_eos=True)
    s.add_request(stops)
    s.add_request(ignores)
    run_step(s, token=EOS)
    assert stops.status == RequestStatus.FINISHED_STOPPED
    assert not ignores.is_finished
    run_to_completion(s)
    assert ignores.num_output_tokens == 5


def test_stop_token_ids_finish_with_the_token_as_reason():
    s = make_scheduler()
    req = make_request("a", 4, max_tokens=10, stop_token_ids=(7,))
    s.add_request(req)
    run_step(s, token=7)
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == 7


def test_context_window_finishes_with_length():
    s = make_scheduler(max_model_len=6)
    req = make_request("a", 4, max_tokens=100)
    s.add_request(req)
    run_to_completion(s)
    assert req.status == RequestStatus.FINISHED_LENGTH
    assert req.num_tokens == 6


def test_abort_frees_blocks_from_running_and_waiting():
    s = make_scheduler(max_num_seqs=1)
    a = make_request("a", 9)
    b = make_request("b", 9)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    assert a.block_ids
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    s.finish_request("b", RequestStatus.FINISHED_ABORTED)
    assert s.kv.num_free_blocks == 64
    assert not s.has_unfinished
    assert s.finish_request("a", RequestStatus.FINISHED_ABORTED) is None


def test_prefix_cache_hit_skips_computed_blocks():
    s = make_scheduler(block_size=4, budget=64)
    first = make_request("first", 10)
    s.add_request(first)
    run_to_completion(s)
    second = make_request("second", 10)  # same tokens
    s.add_request(second)
    out = s.schedule()
    (item,) = out.scheduled
    # 10 tokens = 2 full blocks + 2; both full blocks hit, at least one token is recomputed.
    assert item.start == 8
    assert item.num_new_tokens == 2
    assert second.num_cached_tokens == 8


def test_full_prompt_hit_still_computes_the_last_token():
    s = make_scheduler(block_size=4, budget=64)
    s.add_request(make_request("first", 8))
    run_to_completion(s)
    again = make_request("again", 8)
    s.add_request(again)
    (item,) = s.schedule().scheduled
    assert item.start == 4 and item.num_new_tokens == 4


def test_different_prefix_gets_no_hit():
    s = make_scheduler(block_size=4)
    s.add_request(make_request("first", 10, first_token=10))
    run_to_completion(s)
    other = make_request("other", 10, first_token=500)
    s.add_request(other)
    (item,) = s.schedule().scheduled
    assert item.start == 0


def test_duplicate_request_id_is_rejected():
    s = make_scheduler()
    s.add_request(make_request("a", 3))
    with pytest.raises(ValueError):
        s.add_request(make_request("a", 3))


@pytest.mark.parametrize("seed", range(5))
def test_random_workload_keeps_invariants_and_leaks_nothing(seed):
    import random

    rng = random.Random(seed)
    s = make_scheduler(num_blocks=24, block_size=4, budget=24, max_num_seqs=6, chunk_cap=8)
    for i in range(30):
        s.add_request(
            make_request(
                f"r{i}",
                rng.randint(1, 30),
                max_tokens=rng.randint(1, 20),
                priority=rng.randint(0, 2),
                first_token=rng.choice([10, 10, 300]),
            )
        )
    for _ in range(5000):
        if not s.has_unfinished:
            break
        out = s.schedule()  # check_invariants runs inside
        sampled = {
            x.request.request_id: rng.choice([7, 8, EOS]) for x in out.scheduled if x.samples
        }
        s.update(out, sampled)
        if rng.random() < 0.05 and s.running:
            victim = rng.choice(s.running)
            s.finish_request(victim.request_id, RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished
    assert s.kv.num_free_blocks == 24
    s.kv.pool.check_invariants()


def test_cost_model_sizes_chunks_to_bound_the_decode_slowdown():
    from titan.engine.cost_model import StepCostModel, attention_pairs

    model = StepCostModel(min_samples=4)
    # A synthetic machine: 50 ms per step, 1 ms per token, 2 us per attention pair.
    for tokens, start in [(1, 10), (8, 100), (64, 0), (64, 500), (32, 1500), (4, 40)] * 6:
        pairs = attention_pairs(start, tokens)
        model.observe(tokens, pairs, 0.05 + 0.001 * tokens + 2e-6 * pairs)
    fixed, per_token, per_pair = model.coefficients
    assert fixed == pytest.approx(0.05, rel=1e-6)
    assert per_token == pytest.approx(0.001, rel=1e-6)
    assert per_pair == pytest.approx(2e-6, rel=1e-6)
    decode_time = model.predict(3, 300)
    for start in (0, 1000, 5000):
        n = model.max_prefill_tokens(start, 3, 300, max_slowdown=2.0)
        extra = model.predict(n, attention_pairs(start, n)) - model.coefficients[0]
        extra_one_more = model.predict(n + 1, attention_pairs(start, n + 1)) - fixed
        assert extra <= decode_time < extra_one_more  # the longest chunk that fits
    # Later chunks of a long prompt attend to more keys, so they are shorter.
    assert model.max_prefill_tokens(5000, 3, 300, 2.0) < model.max_prefill_tokens(0, 3, 300, 2.0)
    # Mixed steps that run 50% over their prediction shrink the next chunks; never below 0.
    planned = model.max_prefill_tokens(0, 3, 300, 2.0)
    for _ in range(8):
        model.observe(10, 400, 1.5 * model.predict(10, 400), is_mixed=True)
    assert model.mixed_step_bias == pytest.approx(1.5, rel=0.01)
    assert model.max_prefill_tokens(0, 3, 300, 2.0) < planned
    assert model.max_prefill_tokens(0, 3, 300, 1.2) == 0
    model.mixed_step_bias = 1.0

    s = make_scheduler(budget=512, cost_model=model, max_decode_slowdown=2.0, chunk_cap=7)
    decoders = [make_request(f"d{i}", 4, max_tokens=50) for i in range(3)]
    for r in decoders:
        s.add_request(r)
    run_step(s)
    s.add_request(make_request("long", 400, max_tokens=2))
    out = run_step(s)
    by_id = {x.request.request_id: x.num_new_tokens for x in out.scheduled}
    expected = model.max_prefill_tokens(0, 3, sum(r.num_tokens for r in decoders), 2.0)
    assert by_id["long"] == expected != 7  # the fitted limit replaces the static one


def test_identical_prompts_in_one_step_share_blocks():
    """n > 1: the copies of a prompt admitted together reuse the first copy's full blocks."""
    s = make_scheduler(block_size=4, budget=64)
    copies = [make_request(f"n{i}", 10) for i in range(3)]
    for request in copies:
        s.add_request(request)
    out = s.schedule()
    assert [(x.start, x.num_new_tokens) for x in out.scheduled] == [(0, 10), (8, 2), (8, 2)]
    shared = copies[0].block_ids[:2]
    assert copies[1].block_ids[:2] == shared == copies[2].block_ids[:2]
    assert s.kv.num_total_blocks - s.kv.num_free_blocks == 3 + 1 + 1
