"""Faults injected into a running simulator: the board's effects on plans (an injected clock) and
the control surface over HTTP (the ASGI app through httpx)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from pydantic import ValidationError

from tests.clock import ManualClock
from titan.config import SimulationProfile
from titan.simulate import FailureKind, Simulation
from titan.simulate.faults import RUNTIME_FAULT, FaultBoard
from titan.simulate.server import create_simulator_app

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def fault(**fields: object):
    return RUNTIME_FAULT.validate_python(fields)


def board_and_simulation(profile: SimulationProfile | None = None):
    clock = ManualClock(0.0)
    simulation = Simulation(profile or SimulationProfile(ttft_s=0.1, inter_token_s=0.01), clock)
    return clock, FaultBoard(clock), simulation


def test_a_fault_applies_from_its_injection_for_its_duration():
    clock, board, simulation = board_and_simulation()
    clock.now = 5.0
    active = board.inject(fault(kind="latency_spike", duration_s=2, multiplier=10))
    assert (active.start_s, active.ends_s) == (5.0, 7.0)
    clock.now = 6.9
    slowed = board.shape(simulation.plan())
    assert slowed.ttft_s == pytest.approx(1.0) and slowed.inter_token_s == pytest.approx(0.1)
    assert slowed.is_spike
    clock.now = 7.0
    assert board.shape(simulation.plan()).ttft_s == pytest.approx(0.1)
    assert board.active() == []


def test_latency_spike_can_slow_only_the_tokens():
    _, board, simulation = board_and_simulation()
    board.inject(fault(kind="latency_spike", duration_s=1, multiplier=5, affects="tokens"))
    plan = board.shape(simulation.plan())
    assert plan.ttft_s == pytest.approx(0.1) and plan.inter_token_s == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("spec", "kind", "status", "retry_after_s"),
    [
        ({"kind": "error_burst", "status": 429, "retry_after_s": 2}, FailureKind.ERROR, 429, 2.0),
        ({"kind": "error_burst", "status": 500}, FailureKind.ERROR, 500, None),
        ({"kind": "outage"}, FailureKind.RESET, None, None),
        ({"kind": "outage", "status": 503}, FailureKind.ERROR, 503, 1.0),
        ({"kind": "reset"}, FailureKind.RESET, None, None),
    ],
)
def test_failing_faults(spec, kind, status, retry_after_s):
    _, board, simulation = board_and_simulation()
    board.inject(fault(duration_s=1, **spec))
    failure = board.shape(simulation.plan()).failure
    assert failure is not None and failure.kind is kind
    assert (failure.status, failure.retry_after_s) == (status, retry_after_s)


def test_only_an_outage_makes_health_checks_fail():
    _, board, _ = board_and_simulation()
    board.inject(fault(kind="error_burst", duration_s=1))
    assert board.unavailability() is None
    board.inject(fault(kind="outage", duration_s=1, status=503))
    assert board.unavailability().status == 503


def test_stall_and_probability():
    _, board, simulation = board_and_simulation()
    board.inject(fault(kind="stall", duration_s=1, stall_s=3, probability=0.5))
    plans = [board.shape(simulation.plan()) for _ in range(400)]
    num_stalled = sum(plan.stall_s == 3 for plan in plans)
    assert 140 < num_stalled < 260


def test_faults_leave_the_profiles_own_draws_alone():
    profile = SimulationProfile(spike_probability=0.3, error_probability=0.1, seed=4)
    _, board, with_faults = board_and_simulation(profile)
    _, _, without = board_and_simulation(profile)
    board.inject(fault(kind="latency_spike", duration_s=1, probability=0.5))
    faulted = [board.shape(with_faults.plan()) for _ in range(50)]
    plain = [without.plan() for _ in range(50)]
    assert [p.failure for p in faulted] == [p.failure for p in plain]
    assert [p.first_word for p in faulted] == [p.first_word for p in plain]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "meltdown", "duration_s": 1}, "does not match any of the expected tags"),
        ({"kind": "stall", "duration_s": 1, "multiplier": 3}, "Extra inputs"),
        ({"kind": "outage"}, "Field required"),
        ({"kind": "error_burst", "duration_s": 1, "status": 200}, "greater than or equal to 400"),
    ],
)
def test_invalid_faults_are_refused(spec, message):
    with pytest.raises(ValidationError, match=message):
        fault(**spec)


# ---- over HTTP ------------------------------------------------------------------------------


def client(**options: object) -> httpx.AsyncClient:
    app = create_simulator_app(SimulationProfile(ttft_s=0.0), **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim")


async def test_fault_control_is_off_unless_allowed():
    async with client() as http:
        response = await http.post("/simulation/faults", json={"kind": "outage", "duration_s": 1})
        assert response.status_code in (404, 405)


async def test_fault_control_injects_lists_and_clears():
    async with client(allow_fault_control=True) as http:
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 200
        injected = await http.post(
            "/simulation/faults", json={"kind": "error_burst", "duration_s": 30, "status": 429}
        )
        assert injected.status_code == 200 and injected.json()["status"] == 429
        refused = await http.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        listed = (await http.get("/simulation/faults")).json()
        assert [f["kind"] for f in listed["active"]] == ["error_burst"]
        assert (await http.delete("/simulation/faults")).json() == {"cleared": 1}
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await http.get("/stats")).json()["errors"] == {"429": 1}


async def test_an_injected_outage_fails_health_checks():
    async with client(allow_fault_control=True) as http:
        outage = {"kind": "outage", "duration_s": 30, "status": 503}
        await http.post("/simulation/faults", json=outage)
        assert (await http.get("/health")).status_code == 503


async def test_an_invalid_fault_is_a_400_naming_the_key():
    async with client(allow_fault_control=True) as http:
        response = await http.post("/simulation/faults", json={"kind": "stall", "duration_s": -1})
        assert response.status_code == 400
        assert "duration_s" in response.json()["error"]["message"]


async def test_max_concurrency_makes_answers_wait_their_turn():
    app = create_simulator_app(SimulationProfile(ttft_s=0.2), max_concurrency=2)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        started = time.monotonic()
        answers = await asyncio.gather(
            *(http.post("/v1/chat/completions", json=CHAT) for _ in range(4))
        )
        elapsed = time.monotonic() - started
        assert all(answer.status_code == 200 for answer in answers)
        assert elapsed > 0.38  # two rounds of 0.2 s, not one
        assert (await http.get("/stats")).json()["queued"] == 0
