"""The continuous-batching simulation: an M/D/1 queue in its limit case, small schedules worked
out by hand, the engine's chunk rule, preemption, prefix hits and saturation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from titan.engine.cost_model import StepCostModel
from titan.planning.sim_summary import summarize
from titan.planning.simulator import SchedulerSpec, simulate
from titan.planning.step_cost import LinearStepCost, max_chunk_by_search
from titan.planning.traffic import Arrivals, LengthDistribution, TraceRequest, Traffic


def fixed(n: int) -> LengthDistribution:
    return LengthDistribution("fixed", n)


@pytest.mark.parametrize("rho", [0.5, 0.7])
def test_one_sequence_at_a_time_is_an_md1_queue(rho: float):
    """max_num_seqs 1, one-token outputs, a constant step time D: each request is one step of
    service D, FCFS, Poisson arrivals. Mean wait W_q = ρ·D / (2(1 − ρ)) (Pollaczek–Khinchine)."""
    service_s = 0.1
    traffic = Traffic(Arrivals(rho / service_s), fixed(100), fixed(1))
    # 100,000 requests: the sample mean's spread over seeds is ~1.5% at ρ = 0.7.
    trace = traffic.trace(100_000, seed=3)
    result = simulate(
        trace,
        LinearStepCost(service_s, 0.0),
        SchedulerSpec(max_num_seqs=1, max_num_batched_tokens=512),
    )
    expected_wait = rho * service_s / (2 * (1 - rho))
    assert np.mean(result.queue_s) == pytest.approx(expected_wait, rel=0.05)
    # TTFT = wait + service; utilization = ρ.
    assert np.mean(result.ttft_s) == pytest.approx(expected_wait + service_s, rel=0.05)
    assert summarize(result).utilization == pytest.approx(rho, rel=0.02)


def test_a_small_schedule_worked_by_hand():
    """Steps of 1 s; 2 sequences and 8 tokens per step.
    step 1 (0→1): A (10-token prompt) takes the whole budget: a chunk of 8; B waits.
    step 2 (1→2): A's last 2 prompt tokens (first token at 2); B's 4 (first and only token at
    2); C (arrived at 0.5) finds both sequence slots taken.
    step 3 (2→3): A decodes (its 2nd and last token at 3); C's 3 tokens (its token at 3)."""
    trace = [TraceRequest(0.0, 10, 2), TraceRequest(0.0, 4, 1), TraceRequest(0.5, 3, 1)]
    spec = SchedulerSpec(max_num_seqs=2, max_num_batched_tokens=8)
    result = simulate(trace, LinearStepCost(1.0, 0.0), spec)
    assert result.ttft_s == [2.0, 2.0, 2.5]
    assert result.e2e_s == [3.0, 2.0, 2.5]
    assert result.queue_s == [0.0, 1.0, 1.5]
    assert result.tpot_s[0] == 1.0 and math.isnan(result.tpot_s[1])
    assert result.num_steps == 3
    assert result.step_seqs == [1, 2, 2]


def test_an_idle_engine_starts_at_the_next_arrival():
    trace = [TraceRequest(5.0, 10, 1), TraceRequest(7.5, 10, 3)]
    result = simulate(trace, LinearStepCost(0.5, 0.0), SchedulerSpec(4, 64))
    assert result.ttft_s == [0.5, 0.5]
    assert result.e2e_s == [0.5, 1.5]
    assert result.end_s == 9.0


@pytest.mark.parametrize("start", [0, 100, 1900])
@pytest.mark.parametrize("num_decodes", [1, 8, 32])
def test_the_chunk_rule_is_the_engines(start: int, num_decodes: int):
    """LinearStepCost.max_prefill_tokens solves the engine's StepCostModel rule exactly."""
    coefficients = (0.046, 0.00135, 5e-7)
    engine_model = StepCostModel()
    engine_model.coefficients = coefficients
    engine_model.mixed_step_bias = 1.1
    ours = LinearStepCost(*coefficients, per_seq_s=0.0, mixed_step_bias=1.1)
    pairs = num_decodes * 300
    assert ours.max_prefill_tokens(start, num_decodes, pairs, 2.0) == (
        engine_model.max_prefill_tokens(start, num_decodes, pairs, 2.0)
    )
    # Bisection over any cost model lands on the same chunk (no bias there).
    unbiased = LinearStepCost(*coefficients)
    by_search = max_chunk_by_search(unbiased, start, num_decodes, pairs, 2.0, 4096)
    assert abs(by_search - unbiased.max_prefill_tokens(start, num_decodes, pairs, 2.0)) <= 1


def test_a_long_prompt_is_chunked_while_decodes_run():
    """One decode running: a step of it alone takes 4 + 0.25 = 4.25 s, so at slowdown 2 a chunk
    may add 4.25 s: 17 tokens. A 40-token prompt goes in chunks of 17, 17 and 6."""
    trace = [TraceRequest(0.0, 1, 50), TraceRequest(1.0, 40, 1)]
    cost = LinearStepCost(4.0, 0.25)
    spec = SchedulerSpec(max_num_seqs=4, max_num_batched_tokens=512, max_decode_slowdown=2.0)
    result = simulate(trace, cost, spec)
    # Step 1 (0 → 4.25): the 1-token prompt. Then the chunks beside the decode: 4 + 0.25 · 18,
    # again, then 4 + 0.25 · 7.
    assert result.ttft_s[1] == pytest.approx(4.25 + 8.5 + 8.5 + 5.75 - 1.0)
    assert result.step_seqs[:4] == [1, 2, 2, 2]
    # Without the rule the whole prompt goes in one step.
    budget_only = simulate(trace, cost, SchedulerSpec(4, 512))
    assert budget_only.ttft_s[1] == pytest.approx(4.25 + 4 + 0.25 * 41 - 1.0)


def test_preemption_when_kv_blocks_run_out():
    """4 blocks of 16 tokens. Two 24-token prompts take 2 blocks each; at 33 tokens each needs a
    third: the later arrival (least computed on a tie) is preempted, recomputed once the first
    finishes, and both still produce every token."""
    trace = [TraceRequest(0.0, 24, 20), TraceRequest(0.0, 24, 20)]
    spec = SchedulerSpec(max_num_seqs=4, max_num_batched_tokens=512, num_kv_blocks=4)
    result = simulate(trace, LinearStepCost(1.0, 0.0), spec)
    assert result.num_preemptions >= 1
    assert result.e2e_s[0] < result.e2e_s[1]
    assert result.ttft_s == [1.0, 1.0]  # both prefilled in the first step
    too_big = [TraceRequest(0.0, 100, 1)]
    with pytest.raises(ValueError, match="KV cache cannot hold it"):
        simulate(too_big, LinearStepCost(1.0, 0.0), spec)


def test_shared_prefix_blocks_are_served_from_the_cache():
    """Once the first request computed a 40-token shared prefix, the next computes its prompt
    minus the prefix's 2 whole blocks (32 tokens)."""
    trace = [TraceRequest(0.0, 100, 1), TraceRequest(10.0, 100, 1)]
    cost = LinearStepCost(0.0, 0.01)
    result = simulate(trace, cost, SchedulerSpec(4, 512, shared_prefix_tokens=40))
    assert result.ttft_s == pytest.approx([1.0, 0.68])


def test_saturation_is_detected():
    traffic = Traffic(Arrivals(1.0), fixed(100), fixed(10))
    spec = SchedulerSpec(max_num_seqs=4, max_num_batched_tokens=512)
    cost = LinearStepCost(0.05, 0.001)  # 4 sequences of 10 steps: ~7 requests/s at most
    light = summarize(simulate(traffic.at_rate(2.0).trace(600, 1), cost, spec))
    heavy = summarize(simulate(traffic.at_rate(20.0).trace(600, 1), cost, spec))
    assert not light.is_saturated and heavy.is_saturated
    assert heavy.ttft_p99_s > 10 * light.ttft_p99_s
    assert light.requests_per_s == pytest.approx(2.0, rel=0.15)
