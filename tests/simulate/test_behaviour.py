"""The simulation's decisions as pure data: plans from a profile, a seed and an injected clock."""

from __future__ import annotations

import itertools

import pytest

from tests.clock import ManualClock
from titan.config import Outage, SimulationProfile
from titan.simulate import (
    Failure,
    FailureCause,
    FailureKind,
    RequestPlan,
    Simulation,
    retry_after_header,
)


def plans(profile: SimulationProfile, num: int, step_s: float = 0.0) -> list[RequestPlan]:
    """``num`` plans for requests arriving every ``step_s`` seconds from 0."""
    clock = ManualClock(0.0)
    simulation = Simulation(profile, clock)
    result = []
    for index in range(num):
        clock.now = index * step_s
        result.append(simulation.plan())
    return result


def runs(flags: list[bool]) -> list[int]:
    """The lengths of the runs of True."""
    return [len(list(group)) for is_set, group in itertools.groupby(flags) if is_set]


FAULTY = SimulationProfile(
    seed=7,
    spike_probability=0.2,
    stall_probability=0.2,
    stall_s=1.0,
    reset_probability=0.1,
    error_probability=0.1,
)


def test_same_seed_same_plans_other_seed_other_plans():
    first, second = plans(FAULTY, 200, 0.01), plans(FAULTY, 200, 0.01)
    assert first == second
    other = plans(FAULTY.model_copy(update={"seed": 8}), 200, 0.01)
    assert [p.failure for p in other] != [p.failure for p in first]


def test_a_requests_draws_do_not_depend_on_earlier_failures():
    calm_profile = FAULTY.model_copy(update={"reset_probability": 0, "error_probability": 0})
    calm = plans(calm_profile, 100)
    # The first 50 requests fall into an outage: the ones after it are planned as if it never was.
    with_outage = calm_profile.model_copy(update={"outages": [Outage(start_s=0, duration_s=1)]})
    clock = ManualClock(0.0)
    simulation = Simulation(with_outage, clock)
    shifted = []
    for index in range(100):
        clock.now = 0.5 if index < 50 else 2.0
        shifted.append(simulation.plan())
    assert all(p.failure is not None for p in shifted[:50])
    assert [(p.is_spike, p.stall_s, p.first_word) for p in shifted[50:]] == [
        (p.is_spike, p.stall_s, p.first_word) for p in calm[50:]
    ]


def test_requests_are_numbered_in_arrival_order():
    assert [p.index for p in plans(SimulationProfile(), 5)] == [0, 1, 2, 3, 4]


def test_token_count_follows_max_tokens_up_to_the_profile():
    simulation = Simulation(SimulationProfile(output_tokens=8), ManualClock(0.0))
    default, fewer, more = (simulation.plan(m) for m in (None, 3, 100))
    assert (default.num_output_tokens, default.finish_reason) == (8, "stop")
    assert (fewer.num_output_tokens, fewer.finish_reason) == (3, "length")
    assert (more.num_output_tokens, more.finish_reason) == (8, "stop")
    assert simulation.plan(8).finish_reason == "stop"  # the natural end, not a cut


def test_text_is_one_word_per_token_and_deterministic():
    plan = Simulation(SimulationProfile(output_tokens=40), ManualClock(0.0)).plan()
    assert len(plan.text.split(" ")) == 40
    assert "".join(plan.token_text(i) for i in range(40)) == plan.text
    assert not plan.token_text(0).startswith(" ") and plan.token_text(1).startswith(" ")
    assert (
        plan.text == Simulation(SimulationProfile(output_tokens=40), ManualClock(0.0)).plan().text
    )


def test_timeline_with_gaps_and_a_stall():
    profile = SimulationProfile(
        ttft_s=0.1, inter_token_s=0.01, output_tokens=4, stall_probability=1, stall_s=5
    )
    plan = Simulation(profile, ManualClock(0.0)).plan()
    assert plan.is_stall
    assert plan.token_s(0) == pytest.approx(0.1)
    assert plan.token_s(1) == pytest.approx(5.11)  # silent for stall_s after the first token
    assert plan.token_s(3) == pytest.approx(5.13)
    assert plan.finish_s == pytest.approx(5.13)
    single = Simulation(profile.model_copy(update={"output_tokens": 1}), ManualClock(0.0)).plan()
    assert single.finish_s == pytest.approx(5.1)  # the end of the stream stalls too


def test_spikes_multiply_ttft_and_gaps():
    profile = SimulationProfile(
        ttft_s=0.02, inter_token_s=0.005, spike_probability=1, spike_multiplier=20
    )
    plan = Simulation(profile, ManualClock(0.0)).plan()
    assert plan.is_spike
    assert (plan.ttft_s, plan.inter_token_s) == pytest.approx((0.4, 0.1))
    calm = Simulation(profile.model_copy(update={"spike_probability": 0}), ManualClock(0.0)).plan()
    assert not calm.is_spike and calm.ttft_s == pytest.approx(0.02)


def test_outage_windows_reset_or_answer_their_status():
    profile = SimulationProfile(
        retry_after_s=2.5,
        outages=[
            Outage(start_s=1, duration_s=2),  # connections reset
            Outage(start_s=5, duration_s=1, status=503),
        ],
    )
    clock = ManualClock(0.0)
    simulation = Simulation(profile, clock)
    reset = Failure(FailureKind.RESET, FailureCause.OUTAGE)
    unavailable = Failure(FailureKind.ERROR, FailureCause.OUTAGE, 503, 2.5)
    expected = {0.5: None, 1.0: reset, 2.99: reset, 3.0: None, 5.5: unavailable, 6.0: None}
    for now_s, failure in expected.items():
        clock.now = now_s
        assert simulation.plan().failure == failure, now_s
        assert simulation.unavailability() == failure, now_s


def test_an_outage_that_resets_cuts_answers_under_way():
    profile = SimulationProfile(
        ttft_s=0.05, inter_token_s=0.1, output_tokens=5, outages=[Outage(start_s=1, duration_s=1)]
    )
    clock = ManualClock(0.9)
    simulation = Simulation(profile, clock)
    plan = simulation.plan()  # would end at 0.9 + 0.45
    assert plan.failure is None and plan.cut_s == pytest.approx(0.1)
    clock.now = 0.5  # ends at 0.95, before the outage
    assert simulation.plan().cut_s is None
    with_status = profile.model_copy(
        update={"outages": [Outage(start_s=1, duration_s=1, status=503)]}
    )
    assert Simulation(with_status, ManualClock(0.9)).plan().cut_s is None  # live answers finish


def test_error_bursts_fail_every_request_for_their_duration():
    profile = SimulationProfile(
        error_probability=0.05, error_burst_s=1.0, error_status=503, retry_after_s=1.0
    )
    result = plans(profile, 3000, step_s=0.1)
    failures = [p.failure for p in result if p.failure is not None]
    assert failures and all(
        f == Failure(FailureKind.ERROR, FailureCause.ERROR_BURST, 503, 1.0) for f in failures
    )
    lengths = runs([p.failure is not None for p in result])
    if result[-1].failure is not None:
        lengths.pop()  # the requests ended in the middle of that burst
    # A burst catches its first request and the nine that follow within the second.
    assert min(lengths) >= 10
    assert len(lengths) > 10  # and there are many of them, with healthy stretches between


def test_without_a_duration_an_error_fails_just_its_request():
    profile = SimulationProfile(error_probability=0.05, error_status=429, retry_after_s=0.2)
    result = plans(profile, 20_000, step_s=0.001)
    failures = [p.failure for p in result if p.failure is not None]
    assert len(failures) / len(result) == pytest.approx(0.05, abs=0.01)
    assert failures[0].status == 429 and failures[0].retry_after_s == 0.2


def test_retry_after_only_for_429_and_503():
    for status, retry_after in ((429, 3.0), (503, 3.0), (500, None)):
        profile = SimulationProfile(error_probability=1, error_status=status, retry_after_s=3)
        assert Simulation(profile, ManualClock(0.0)).plan().failure.retry_after_s == retry_after


def test_probabilities_are_roughly_right():
    profile = SimulationProfile(
        seed=3, spike_probability=0.1, stall_probability=0.2, reset_probability=0.05
    )
    result = plans(profile, 20_000)
    num = len(result)
    assert sum(p.is_spike for p in result) / num == pytest.approx(0.1, abs=0.01)
    assert sum(p.is_stall for p in result) / num == pytest.approx(0.2, abs=0.015)
    resets = [p for p in result if p.failure is not None]
    assert len(resets) / num == pytest.approx(0.05, abs=0.01)
    assert {p.failure for p in resets} == {Failure(FailureKind.RESET, FailureCause.RANDOM_RESET)}


def test_retry_after_header_rounds_up_to_whole_seconds():
    assert [retry_after_header(s) for s in (0, 0.2, 1.0, 2.5)] == ["0", "1", "1", "3"]
