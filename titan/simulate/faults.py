"""Faults injected into a running simulator, from now for a while (chaos runs).

A profile fixes a backend's behaviour when it starts; a chaos scenario needs to change it at a
moment of its timeline ("from t=12 s, 3 s of 429s"). ``titan simulate --allow-fault-control``
serves ``POST /simulation/faults`` for that: each fault applies from its arrival for
``duration_s`` and is then forgotten. Faults reshape the plans the profile makes, so both add up.

Probabilistic faults draw from their own seeded generator, a fixed number of values per request
while any fault is active: the profile's own draws (five per request) are untouched, so a
backend's behaviour outside the faults does not depend on whether faults were ever injected.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Literal, get_args

from pydantic import Field, TypeAdapter

from titan.config.settings import Settings
from titan.simulate.behaviour import (
    RETRY_AFTER_STATUSES,
    Failure,
    FailureCause,
    FailureKind,
    RequestPlan,
)


class LatencySpike(Settings):
    """Requests are ``multiplier`` times slower: their time to first token, their token gaps,
    or both (``affects``)."""

    kind: Literal["latency_spike"]
    duration_s: float = Field(gt=0)
    multiplier: float = Field(10.0, ge=1)
    probability: float = Field(1.0, ge=0, le=1)  # share of the requests it slows
    affects: Literal["all", "first_token", "tokens"] = "all"


class ErrorBurst(Settings):
    """Requests get an HTTP error (with Retry-After for 429 and 503) instead of an answer."""

    kind: Literal["error_burst"]
    duration_s: float = Field(gt=0)
    status: int = Field(503, ge=400, le=599)
    probability: float = Field(1.0, ge=0, le=1)
    retry_after_s: float = Field(1.0, ge=0)


class Stall(Settings):
    """Streams stop after their first token for ``stall_s`` (a whole answer comes that late)."""

    kind: Literal["stall"]
    duration_s: float = Field(gt=0)
    stall_s: float = Field(60.0, gt=0)
    probability: float = Field(1.0, ge=0, le=1)


class OutageFault(Settings):
    """Every request, health check and model listing fails: connections reset (no ``status``)
    or the status is answered."""

    kind: Literal["outage"]
    duration_s: float = Field(gt=0)
    status: int | None = Field(None, ge=400, le=599)
    retry_after_s: float = Field(1.0, ge=0)


class ResetFault(Settings):
    """Connections drop before any byte of the answer."""

    kind: Literal["reset"]
    duration_s: float = Field(gt=0)
    probability: float = Field(1.0, ge=0, le=1)


Fault = LatencySpike | ErrorBurst | Stall | OutageFault | ResetFault
RuntimeFault = Annotated[Fault, Field(discriminator="kind")]
RUNTIME_FAULT = TypeAdapter(RuntimeFault)
FAULT_KINDS = ("latency_spike", "error_burst", "stall", "outage", "reset")


def fault_parameters() -> dict[str, tuple[str, ...]]:
    """Each kind's parameters besides ``kind`` and ``duration_s``."""
    return {
        get_args(model.model_fields["kind"].annotation)[0]: tuple(
            name for name in model.model_fields if name not in ("kind", "duration_s")
        )
        for model in get_args(Fault)
    }


@dataclass(frozen=True, slots=True)
class ActiveFault:
    fault: Fault
    start_s: float  # on the simulation's clock
    ends_s: float

    def as_dict(self) -> dict[str, object]:
        return {"start_s": self.start_s, "ends_s": self.ends_s, **self.fault.model_dump()}


@dataclass(frozen=True, slots=True)
class _Draws:
    """One request's random values, one per kind that can spare a request."""

    error: float
    reset: float
    spike: float
    stall: float


class FaultBoard:
    """The faults in force now. ``now``: the simulation's clock (seconds since start)."""

    def __init__(self, now: Callable[[], float], seed: int = 0):
        self._now = now
        self._random = random.Random(seed)
        self._faults: list[ActiveFault] = []
        self.num_injected = 0

    def inject(self, fault: Fault) -> ActiveFault:
        start_s = self._now()
        active = ActiveFault(fault, start_s, start_s + fault.duration_s)
        self._faults.append(active)
        self.num_injected += 1
        return active

    def clear(self) -> int:
        num_cleared = len(self.active())
        self._faults.clear()
        return num_cleared

    def active(self) -> list[ActiveFault]:
        at_s = self._now()
        self._faults = [f for f in self._faults if f.ends_s > at_s]  # the rest are over
        return [f for f in self._faults if f.start_s <= at_s]

    def unavailability(self) -> Failure | None:
        """The failure a health check or a model listing sees now (draws nothing)."""
        for active in self.active():
            if isinstance(active.fault, OutageFault):
                return _outage_failure(active.fault)
        return None

    def shape(self, plan: RequestPlan) -> RequestPlan:
        """``plan`` as the faults in force make it. A plan that already fails stays as it is."""
        if not self._faults:  # the hot path of a simulator nobody injects faults into
            return plan
        faults = [active.fault for active in self.active()]
        if not faults or plan.failure is not None:
            return plan
        draw = self._random.random
        draws = _Draws(error=draw(), reset=draw(), spike=draw(), stall=draw())
        failure = _failure(faults, draws)
        if failure is not None:
            return replace(plan, failure=failure, cut_s=None)
        for fault in faults:
            if isinstance(fault, LatencySpike) and draws.spike < fault.probability:
                plan = _slowed(plan, fault)
            elif isinstance(fault, Stall) and draws.stall < fault.probability:
                plan = replace(plan, stall_s=max(plan.stall_s, fault.stall_s))
        return plan


def _failure(faults: list[Fault], draws: _Draws) -> Failure | None:
    """An outage beats an error burst, which beats a reset (the order a client would notice)."""
    for fault in faults:
        if isinstance(fault, OutageFault):
            return _outage_failure(fault)
    for fault in faults:
        if isinstance(fault, ErrorBurst) and draws.error < fault.probability:
            retry_after = fault.retry_after_s if fault.status in RETRY_AFTER_STATUSES else None
            return Failure(FailureKind.ERROR, FailureCause.ERROR_BURST, fault.status, retry_after)
    for fault in faults:
        if isinstance(fault, ResetFault) and draws.reset < fault.probability:
            return Failure(FailureKind.RESET, FailureCause.RANDOM_RESET)
    return None


def _outage_failure(fault: OutageFault) -> Failure:
    if fault.status is None:
        return Failure(FailureKind.RESET, FailureCause.OUTAGE)
    retry_after = fault.retry_after_s if fault.status in RETRY_AFTER_STATUSES else None
    return Failure(FailureKind.ERROR, FailureCause.OUTAGE, fault.status, retry_after)


def _slowed(plan: RequestPlan, spike: LatencySpike) -> RequestPlan:
    ttft_s, inter_token_s = plan.ttft_s, plan.inter_token_s
    if spike.affects in ("all", "first_token"):
        ttft_s *= spike.multiplier
    if spike.affects in ("all", "tokens"):
        inter_token_s *= spike.multiplier
    return replace(plan, ttft_s=ttft_s, inter_token_s=inter_token_s, is_spike=True)
