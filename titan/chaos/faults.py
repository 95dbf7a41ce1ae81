"""The fault timeline: a scenario's faults as actions at times (inject a runtime fault into a
simulator, kill a process, start it again), run on a clock, and what actually happened.

Each action starts at its time in a task of its own, so a slow one (a restart waits until the
process answers) does not hold the next back; actions on one target run in their order (a
restart never overtakes the kill before it). The clock and the sleep are injected: tests run a
timeline on a fake clock without waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from titan.chaos.scenario import TITAN_REPLICA, FaultSpec, Scenario
from titan.simulate.faults import Fault

ActionKind = Literal["inject", "kill", "start"]


class FaultTargets(Protocol):
    """What the timeline acts on: the run's backends and Titan replicas."""

    async def inject(self, target: str, fault: Fault) -> None: ...

    async def kill(self, target: str) -> None: ...

    async def start(self, target: str) -> None:
        """Starts the target again (a no-op if it runs) and returns once it answers."""
        ...


@dataclass
class Occurrence:
    """One occurrence of a fault: planned, and as it happened (None: not yet, or never)."""

    fault_id: str
    kind: str
    target: str
    planned: tuple[float, float | None]  # [start, end); None: until the run ends
    started_s: float | None = None
    ended_s: float | None = None
    error: str | None = None

    def interval(self, run_end_s: float) -> tuple[float, float]:
        """When it was in force: as it happened where known, else as planned."""
        start = self.started_s if self.started_s is not None else self.planned[0]
        end = self.ended_s if self.ended_s is not None else self.planned[1]
        return (start, run_end_s if end is None else end)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.fault_id,
            "kind": self.kind,
            "target": self.target,
            "planned": list(self.planned),
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            "error": self.error,
        }


@dataclass(frozen=True)
class Action:
    at_s: float
    kind: ActionKind
    target: str
    occurrence: Occurrence
    fault: Fault | None = None
    is_first: bool = True  # the occurrence starts with it
    is_last: bool = True  # the occurrence ends with it (kill_restart: the start)


def canonical_target(target: str) -> str:
    """ "titan" is the first replica."""
    return f"{TITAN_REPLICA}-1" if target == TITAN_REPLICA else target


def plan_actions(scenario: Scenario) -> tuple[list[Action], list[Occurrence]]:
    """Every action of the timeline in time order, and the occurrences they make up."""
    actions: list[Action] = []
    occurrences: list[Occurrence] = []
    for spec in scenario.faults:
        for at_s in spec.occurrences():
            made = _actions_of(spec, at_s)
            actions += made
            occurrences.append(made[0].occurrence)
    actions.sort(key=lambda action: action.at_s)  # stable: a kill stays before its start
    occurrences.sort(key=lambda occurrence: occurrence.planned[0])
    return actions, occurrences


def _actions_of(spec: FaultSpec, at_s: float) -> list[Action]:
    target = canonical_target(spec.target)
    if spec.is_runtime:
        fault = spec.runtime_fault()
        occurrence = Occurrence(spec.name, spec.kind, target, (at_s, at_s + fault.duration_s))
        return [Action(at_s, "inject", target, occurrence, fault)]
    if spec.kind == "kill":
        occurrence = Occurrence(spec.name, spec.kind, target, (at_s, None))
        return [Action(at_s, "kill", target, occurrence, is_last=False)]
    if spec.kind == "restart":
        occurrence = Occurrence(spec.name, spec.kind, target, (at_s, at_s))
        return [Action(at_s, "start", target, occurrence)]
    down_s = spec.down_s or 0.0
    occurrence = Occurrence(spec.name, spec.kind, target, (at_s, at_s + down_s))
    return [
        Action(at_s, "kill", target, occurrence, is_last=False),
        Action(at_s + down_s, "start", target, occurrence, is_first=False),
    ]


@dataclass
class FaultTimeline:
    """Runs the actions against ``targets`` at their times on ``clock`` (seconds since the
    timeline's 0). ``on_event`` hears each action as it completes, for the progress display."""

    actions: list[Action]
    targets: FaultTargets
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    on_event: Callable[[str], None] = lambda message: None
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def run(self) -> None:
        """Returns once every action has run (failures are recorded on their occurrences)."""
        tasks = []
        for action in self.actions:
            delay = action.at_s - self.clock()
            if delay > 0:
                await self.sleep(delay)
            lock = self._locks.setdefault(action.target, asyncio.Lock())
            tasks.append(asyncio.ensure_future(self._perform(action, lock)))
            await asyncio.sleep(0)  # let it take its target's lock before a later action
        await asyncio.gather(*tasks)

    async def _perform(self, action: Action, lock: asyncio.Lock) -> None:
        occurrence = action.occurrence
        async with lock:
            if action.is_first:
                occurrence.started_s = self.clock()
            try:
                if action.fault is not None:
                    await self.targets.inject(action.target, action.fault)
                elif action.kind == "kill":
                    await self.targets.kill(action.target)
                else:
                    await self.targets.start(action.target)
            except Exception as exc:  # recorded for the report; the run goes on
                occurrence.error = f"{action.kind} {action.target}: {exc}"
                self.on_event(f"failed: {occurrence.error}")
                return
            now = self.clock()
            if action.fault is not None:
                occurrence.ended_s = (occurrence.started_s or now) + action.fault.duration_s
            elif action.is_last:
                occurrence.ended_s = now
            self.on_event(f"{now:6.1f}s  {action.kind} {action.target} ({occurrence.fault_id})")
