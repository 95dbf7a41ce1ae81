"""Assertions on synthetic observations: parsing, each family of metrics, scopes and verdicts."""

from __future__ import annotations

import pytest

from tests.chaos.factories import request, scenario_data
from titan.chaos.checks import judge, parse_check
from titan.chaos.faults import Occurrence
from titan.chaos.measures import Scope, Slo, measure, union
from titan.chaos.records import (
    BackendSample,
    Observations,
    TitanSample,
    increase,
    outcome_of,
    record_of,
)
from titan.chaos.scenario_files import scenario_from_mapping
from titan.chaos.verdicts import judge_all, scope_of
from titan.loadgen import Sample

WHOLE = Scope(((0.0, 10.0),))


def observations(requests=(), titan=(), backends=()) -> Observations:
    return Observations(10.0, list(requests), list(titan), list(backends))


def value(check: str, seen: Observations, scope: Scope = WHOLE, slo: Slo | None = None):
    parsed = parse_check(f"{check} >= 0")  # only the metric and its argument matter here
    return measure(parsed.metric, parsed.argument, scope, seen, slo or Slo())


def test_parse_check():
    check = parse_check(" error_rate( 429 ) <= 0.5 ")
    assert (check.metric, check.argument, check.op, check.threshold) == (
        "error_rate",
        "429",
        "<=",
        0.5,
    )
    assert str(parse_check("p99_ttft_ms<300")) == "p99_ttft_ms < 300"
    with pytest.raises(ValueError, match="takes no argument"):
        parse_check("success_rate(x) >= 1")


def test_latency_percentiles_count_successful_requests_but_wait_counts_all():
    seen = observations(
        [request(i * 0.1, ttft_s=0.01 * (i + 1), e2e_s=0.1) for i in range(100)]
        + [request(5.0, "503", e2e_s=3.0)]
    )
    assert value("p50_ttft_ms", seen) == pytest.approx(505)
    assert value("max_ttft_ms", seen) == pytest.approx(1000)
    assert value("p99_e2e_ms", seen) == pytest.approx(100)
    assert value("max_wait_ms", seen) == pytest.approx(3000)


def test_rates_and_errors():
    seen = observations(
        [request(float(i)) for i in range(6)]
        + [request(6.5, "429"), request(7.5, "transport"), request(8.5, "stream")]
    )
    assert value("requests", seen) == 9
    assert value("success_rate", seen) == pytest.approx(6 / 9)
    assert value("error_rate", seen) == pytest.approx(3 / 9)
    assert value("error_rate(429)", seen) == pytest.approx(1 / 9)
    assert value("errors(stream)", seen) == 1
    assert value("rps", seen) == pytest.approx(0.9) and value("ok_rps", seen) == pytest.approx(0.6)
    window = Scope(((0.0, 5.0),))
    assert value("error_rate", seen, window) == 0 and value("ok_rps", seen, window) == 1


def test_slo_attainment_and_goodput():
    seen = observations([request(0, ttft_s=0.1), request(1, ttft_s=0.9), request(2, "503")])
    slo = Slo(ttft_s=0.5)
    assert value("slo_attainment", seen, slo=slo) == pytest.approx(1 / 3)
    assert value("goodput_rps", seen, slo=slo) == pytest.approx(0.1)


def test_models_filter_requests():
    seen = observations([request(0, model="x", ttft_s=0.1), request(1, model="y", ttft_s=0.9)])
    assert value("max_ttft_ms", seen, Scope(((0, 10),), model="x")) == pytest.approx(100)


def titan_sample(at_s, openings=0, state=0, retries=0.0, replica="titan-1", is_up=True):
    return TitanSample(at_s, replica, is_up, {"chat/b": state, "chat/a": 0},
                       {"chat/b": openings, "chat/a": 0}, {"retries": retries})  # fmt: skip


def test_counters_count_increases_across_a_restart():
    # the replica restarted between 4 and 5: its counters start again from 0
    samples = [titan_sample(0, 0, retries=0), titan_sample(2, 1, state=2, retries=4),
               titan_sample(4, 2, retries=5), titan_sample(4.5, is_up=False),
               titan_sample(5, 1, retries=1), titan_sample(8, 1, retries=3)]  # fmt: skip
    seen = observations(titan=samples)
    assert value("breaker_openings(b)", seen) == 3
    assert value("breaker_openings(chat/b)", seen) == 3
    assert value("breaker_openings(a)", seen) == 0
    assert value("retries", seen) == 8
    assert value("retries", seen, Scope(((1, 3),))) == 4
    assert value("breaker_open_share(b)", seen) == pytest.approx(1 / 5)
    assert increase([(0, 1), (1, 3), (2, 0), (3, 2)], 0, 10) == 4


def test_backend_metrics():
    samples = [BackendSample(0, "b", True, 0, 1, 0), BackendSample(1, "b", True, 10, 4, 2),
               BackendSample(2, "b", False), BackendSample(3, "b", True, 3, 0, 0)]  # fmt: skip
    seen = observations(backends=samples)
    assert value("backend_requests(b)", seen) == 13
    assert value("backend_peak_busy(b)", seen) == 4 and value("backend_peak_queued(b)", seen) == 2
    assert value("backend_requests(zz)", seen) is None


def test_nothing_to_measure_fails_the_assertion():
    check = parse_check("p99_ttft_ms <= 100")
    verdict = judge(check, name="n", scope=WHOLE, scope_text="all", seen=observations(), slo=Slo())
    assert (
        not verdict.passed and verdict.measured is None and "nothing to measure" in verdict.detail
    )


def test_scopes_follow_the_faults_as_they_happened():
    data = scenario_data(assertions=[
        {"check": "error_rate == 0", "during": "slow", "extend_s": 1},
        {"check": "error_rate == 0", "window": [1, 20]},
        {"check": "p99_ttft_ms <= 150", "model": "chat"},
    ])  # fmt: skip
    scenario = scenario_from_mapping(data, "s.yaml")
    late = Occurrence("slow", "latency_spike", "b", (2.0, 5.0), started_s=2.5, ended_s=5.5)
    again = Occurrence("slow", "latency_spike", "b", (6.0, 9.0))
    scope, text = scope_of(scenario.assertions[0], 10.0, [late, again])
    assert scope.intervals == ((2.5, 10.0),) and text == "during slow (+1 s)"
    scope, text = scope_of(scenario.assertions[1], 10.0, [])
    assert scope.intervals == ((1, 10.0),) and text == "window 1-20 s"
    seen = observations([request(0.5, ttft_s=0.1), request(3.0, "503"), request(9.5)])
    verdicts = judge_all(scenario, seen, [late, again])
    assert [v.passed for v in verdicts] == [False, False, True]
    assert verdicts[0].measured == pytest.approx(1 / 2)


def test_union_merges_overlaps():
    assert union([(5, 6), (0, 2), (1, 3)]) == ((0, 3), (5, 6))


def test_records_from_load_samples():
    def sample(status, error=None, ttft_s=0.1):
        return Sample(sent_s=1.0, status=status, e2e_s=0.5, ttft_s=ttft_s, output_tokens=5,
                      prompt_tokens=3, itl_s=(0.1,) * 4, error=error)  # fmt: skip

    assert [outcome_of(sample(200)), outcome_of(sample(0, "refused")), outcome_of(sample(503)),
            outcome_of(sample(200, "error event in the stream"))] == [
        "ok", "transport", "503", "stream"]  # fmt: skip
    record = record_of(sample(200), 2.0, "chat", "titan-1")
    assert record.sent_s == 3.0 and record.tpot_s == pytest.approx(0.1)
