"""The fault timeline on a fake clock: actions planned from the scenario, run at their times, in
order per target, and what happened recorded on each occurrence."""

from __future__ import annotations

import asyncio

import pytest

from tests.chaos.factories import scenario_data
from tests.clock import ManualClock
from titan.chaos.faults import FaultTimeline, plan_actions
from titan.chaos.scenario_files import scenario_from_mapping
from titan.simulate.faults import Fault


class FakeTargets:
    """Records each call with the fake time; a start takes ``start_s`` of fake time."""

    def __init__(self, clock: ManualClock, start_s: float = 0.0, failing: str | None = None):
        self.clock = clock
        self.start_s = start_s
        self.failing = failing
        self.calls: list[tuple[float, str, str]] = []

    async def inject(self, target: str, fault: Fault) -> None:
        if target == self.failing:
            raise RuntimeError("no control surface")
        self.calls.append((self.clock(), f"inject {fault.kind}", target))

    async def kill(self, target: str) -> None:
        self.calls.append((self.clock(), "kill", target))

    async def start(self, target: str) -> None:
        self.clock.now += self.start_s  # a restart waits until the process answers
        self.calls.append((self.clock(), "start", target))


FAULTS = [
    {"id": "spikes", "at_s": 1, "kind": "latency_spike", "target": "b", "duration_s": 2,
     "every_s": 4, "times": 2},
    {"id": "flap", "at_s": 2, "kind": "kill_restart", "target": "a", "down_s": 1.5},
    {"id": "crash", "at_s": 8, "kind": "kill", "target": "titan"},
]  # fmt: skip


def timeline(clock: ManualClock, targets: FakeTargets):
    scenario = scenario_from_mapping(scenario_data(faults=FAULTS, assertions=[]), "s.yaml")
    actions, occurrences = plan_actions(scenario)
    return FaultTimeline(actions, targets, clock, clock.sleep), occurrences


def test_plan_orders_every_action_and_occurrence():
    clock = ManualClock(0.0)
    runner, occurrences = timeline(clock, FakeTargets(clock))
    assert [(a.at_s, a.kind, a.target) for a in runner.actions] == [
        (1, "inject", "b"), (2, "kill", "a"), (3.5, "start", "a"), (5, "inject", "b"),
        (8, "kill", "titan-1"),
    ]  # fmt: skip
    assert [(o.fault_id, o.planned) for o in occurrences] == [
        ("spikes", (1, 3)), ("flap", (2, 3.5)), ("spikes", (5, 7)), ("crash", (8, None)),
    ]  # fmt: skip


async def test_actions_run_at_their_times_and_record_what_happened():
    clock = ManualClock(0.0)
    targets = FakeTargets(clock, start_s=0.7)
    runner, occurrences = timeline(clock, targets)
    await runner.run()
    assert targets.calls == [
        (1, "inject latency_spike", "b"), (2, "kill", "a"), (pytest.approx(4.2), "start", "a"),
        (5, "inject latency_spike", "b"), (8, "kill", "titan-1"),
    ]  # fmt: skip
    spikes, flap, _, crash = occurrences
    assert (spikes.started_s, spikes.ended_s) == (1, 3)
    # the restart's start-up time counts: b was down until it answered again
    assert flap.started_s == 2 and flap.ended_s == pytest.approx(4.2)
    assert crash.started_s == 8 and crash.ended_s is None and crash.interval(10) == (8, 10)


async def test_a_failed_action_is_recorded_and_the_rest_runs():
    clock = ManualClock(0.0)
    targets = FakeTargets(clock, failing="b")
    events: list[str] = []
    runner, occurrences = timeline(clock, targets)
    runner.on_event = events.append
    await runner.run()
    assert occurrences[0].error == "inject b: no control surface"
    assert occurrences[0].ended_s is None
    assert [call[1] for call in targets.calls] == ["kill", "start", "kill"]
    assert any(event.startswith("failed: inject b") for event in events)


async def test_actions_on_one_target_keep_their_order():
    """A slow restart holds back the next action on its target, not the others."""
    clock = ManualClock(0.0)
    faults = [
        {"at_s": 1, "kind": "kill_restart", "target": "a", "down_s": 0},
        {"at_s": 1.5, "kind": "kill", "target": "a"},
        {"at_s": 1.5, "kind": "kill", "target": "b"},
    ]
    scenario = scenario_from_mapping(scenario_data(faults=faults, assertions=[]), "s.yaml")
    actions, _ = plan_actions(scenario)
    order: list[str] = []
    gate = asyncio.Event()

    class SlowStart(FakeTargets):
        async def kill(self, target: str) -> None:
            order.append(f"kill {target}")

        async def start(self, target: str) -> None:
            await gate.wait()
            order.append(f"start {target}")

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)
        if clock.now >= 1.5:
            gate.set()

    await FaultTimeline(actions, SlowStart(clock), clock, sleep).run()
    assert order.index("start a") < order.index("kill a", 1)
