"""The simulated model server in simulated time: prefix caching, queueing, the step cost,
eviction and preemption, and its vLLM-named metrics. Nothing sleeps: steps run on their own
times (``run_until_idle``) or on the one fake clock."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.clock import ManualClock
from titan.config.simulation import ModelServerProfile, SimulationProfile, StepCostProfile
from titan.simulate.driver import ServerDriver
from titan.simulate.kv_blocks import tokenize
from titan.simulate.model_server import ModelServer, RequestTooLong, run_until_idle
from titan.simulate.server_metrics import ServerMetrics

FIXED_S, PER_TOKEN_S = 0.004, 0.0001
COST = StepCostProfile(fixed_s=FIXED_S, per_token_s=PER_TOKEN_S)
SYSTEM = b"You are a helpful assistant. " * 70  # 2,030 bytes: 507 tokens, 31 whole blocks


def server_with(**settings) -> tuple[ModelServer, ServerMetrics]:
    metrics = ServerMetrics("sim")
    server = ModelServer(ModelServerProfile(step_cost=COST, **settings), metrics)
    metrics.watch(server)
    return server, metrics


def prompt(text: bytes):
    return tokenize(text, block_size=16)


def samples(metrics: ServerMetrics) -> dict[str, float]:
    """Every sample of the exposition, parsed by prometheus_client's own parser."""
    text = metrics.exposition().decode()
    return {
        sample.name + ("" if "le" not in sample.labels else f"[{sample.labels['le']}]"): (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_shared_prefix_is_a_hit_and_the_second_ttft_is_only_its_uncached_prefill():
    server, metrics = server_with()
    first = server.submit(prompt(SYSTEM + b"What is 2+2?"), 4, now_s=0.0)
    run_until_idle(server, [first])
    second = server.submit(prompt(SYSTEM + b"Name a colour."), 4, now_s=10.0)
    run_until_idle(server, [second])

    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 31 * 16
    uncached = second.num_prompt_tokens - 31 * 16
    assert first.first_token_s - first.arrival_s == pytest.approx(
        FIXED_S + PER_TOKEN_S * first.num_prompt_tokens
    )
    assert second.first_token_s - second.arrival_s == pytest.approx(
        FIXED_S + PER_TOKEN_S * uncached
    )
    values = samples(metrics)
    assert values["vllm:prefix_cache_hits_total"] == 31 * 16
    assert values["vllm:prefix_cache_queries_total"] == (
        first.num_prompt_tokens + second.num_prompt_tokens
    )
    assert values["vllm:prompt_tokens_total"] == first.num_prompt_tokens + second.num_prompt_tokens
    assert values["vllm:generation_tokens_total"] == 8
    assert values["vllm:time_to_first_token_seconds_count"] == 2
    assert values["vllm:e2e_request_latency_seconds_count"] == 2
    assert values["vllm:request_success_total"] == 2


def test_without_prefix_caching_nothing_hits():
    server, _ = server_with(enable_prefix_caching=False)
    first = server.submit(prompt(SYSTEM + b"a"), 2, now_s=0.0)
    run_until_idle(server, [first])
    second = server.submit(prompt(SYSTEM + b"a"), 2, now_s=1.0)
    run_until_idle(server, [second])
    assert second.num_cached_tokens == 0


def test_ttft_includes_the_queue_behind_a_busy_batch():
    server, _ = server_with(max_num_batched_tokens=512)
    long = server.submit(prompt(b"x" * 8000), 2, now_s=0.0)  # 2,000 tokens: 4 chunks of 512
    short = server.submit(prompt(b"y" * 40), 2, now_s=0.0)
    run_until_idle(server, [long, short])
    # The short prompt waited for the long one's chunks to leave room in the token budget.
    assert short.first_token_s > FIXED_S + PER_TOKEN_S * 10 * 4
    assert short.scheduled_s > short.arrival_s


def test_decoding_slows_with_the_batch_as_the_step_cost_says():
    def gap(num_sequences: int) -> float:
        server, _ = server_with()
        sequences = [server.submit(prompt(b"%d" % i * 4), 20, 0.0) for i in range(num_sequences)]
        run_until_idle(server, sequences)
        last = sequences[-1]  # it decodes beside all the others
        return (last.finish_s - last.first_token_s) / (last.num_output - 1)

    assert gap(1) == pytest.approx(FIXED_S + PER_TOKEN_S)
    assert FIXED_S + 31 * PER_TOKEN_S <= gap(32) <= FIXED_S + 32 * PER_TOKEN_S


def next_step(server: ModelServer) -> None:
    """Requests that arrive during a step join the next one: end the step under way."""
    server.advance(server.next_step_end_s or math.inf)


def test_a_full_kv_cache_makes_requests_wait_and_the_metrics_show_it():
    server, metrics = server_with(kv_cache_tokens=1024)
    sequences = [server.submit(prompt(bytes([65 + i]) * 1600), 8, now_s=0.0) for i in range(4)]
    next_step(server)
    # 400 tokens (25 blocks) each: two fit in 64 blocks, the others wait for their blocks.
    assert len(server.running) == 2 and len(server.waiting) == 2
    values = samples(metrics)
    assert values["vllm:num_requests_waiting"] == 2 and values["vllm:num_requests_running"] == 2
    assert 0.75 < values["vllm:kv_cache_usage_perc"] <= 1.0
    run_until_idle(server, sequences)
    assert samples(metrics)["vllm:num_requests_waiting"] == 0
    assert samples(metrics)["vllm:kv_cache_usage_perc"] == 0.0


def test_the_sequence_cap_queues_the_rest():
    server, _ = server_with(max_num_seqs=2)
    sequences = [server.submit(prompt(b"%d" % i * 8), 4, now_s=0.0) for i in range(5)]
    next_step(server)
    assert len(server.running) == 2 and len(server.waiting) == 3
    run_until_idle(server, sequences)
    assert all(s.is_finished for s in sequences)


def test_pressure_evicts_the_least_recently_used_prefix():
    server, _ = server_with(kv_cache_tokens=1024)  # 64 blocks
    old = SYSTEM  # 31 blocks
    recent = b"Another long system prompt. " * 72  # 31 blocks
    now = 0.0
    for text in (old, recent, b"fill" * 500):  # the last needs 32 blocks: the old prefix goes
        sequence = server.submit(prompt(text + b"?"), 2, now_s=now)
        now = run_until_idle(server, [sequence]) + 1.0
    assert server.pool.num_evictions > 0
    recent_again = server.submit(prompt(recent + b"!"), 2, now_s=now)
    old_again = server.submit(prompt(old + b"!"), 2, now_s=now)
    assert recent_again.num_cached_tokens == 31 * 16
    assert old_again.num_cached_tokens < 31 * 16


def test_running_out_of_blocks_while_decoding_preempts_and_everything_finishes():
    server, metrics = server_with(kv_cache_tokens=256)  # 16 blocks
    sequences = [server.submit(prompt(bytes([97 + i]) * 180), 80, now_s=0.0) for i in range(4)]
    run_until_idle(server, sequences)
    assert server.num_preemptions > 0
    assert samples(metrics)["vllm:num_preemptions_total"] == server.num_preemptions
    assert all(s.num_generated == 80 for s in sequences) and server.pool.num_used == 0


def test_an_aborted_request_gives_its_blocks_back():
    server, _ = server_with()
    sequence = server.submit(prompt(b"q" * 400), 50, now_s=0.0)
    next_step(server)
    assert server.pool.num_used > 0
    server.abort(sequence)
    assert server.pool.num_used == 0 and not server.running


def test_a_request_that_could_never_fit_is_refused():
    server, _ = server_with(kv_cache_tokens=256)
    with pytest.raises(RequestTooLong, match="exceed the KV cache"):
        server.submit(prompt(b"z" * 1000), 10, now_s=0.0)


def test_the_profile_refuses_a_cache_smaller_than_a_block():
    with pytest.raises(ValueError, match="at least one block"):
        ModelServerProfile(kv_cache_tokens=8, block_size=16)
    assert SimulationProfile().server is None  # opt-in: today's profiles are unchanged


async def test_the_driver_runs_the_steps_on_the_injected_clock(clock: ManualClock):
    server, _ = server_with()
    driver = ServerDriver(server, clock, sleep=clock.sleep)
    started = clock.now
    sequence = driver.submit(prompt(SYSTEM), 3)
    try:
        await driver.until_generated(sequence, 1)
        assert sequence.first_token_s - started == pytest.approx(FIXED_S + PER_TOKEN_S * 508)
        await driver.until_generated(sequence, 3)
        assert sequence.finish_s - started == pytest.approx(FIXED_S * 3 + PER_TOKEN_S * 510)
        assert sequence.is_finished and clock.now >= sequence.finish_s
    finally:
        driver.release(sequence)
        await driver.stop()
