"""A chaos scenario: backends, a Titan config over them, a load, a timeline of faults and the
assertions the run must meet — one YAML file, validated here (typed, frozen, unknown keys
rejected), and shortened by ``scaled``.

Times on the scenario's timeline (durations, fault times and lengths, windows) count from the
start of the measured load and are what ``--time-scale`` multiplies. Times that describe how the
systems behave (latencies, timeouts, breaker settings, a stall's length, Retry-After, the
load's warm-up and client timeout) are not scaled: a shortened run meets the same systems, for
less time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from titan.chaos.checks import parse_check
from titan.config.settings import Settings
from titan.config.simulation import SimulationProfile
from titan.simulate.faults import FAULT_KINDS, RUNTIME_FAULT, Fault, fault_parameters

FaultKind = Literal[
    "latency_spike", "error_burst", "stall", "outage", "reset", "kill", "restart", "kill_restart"
]
# Parameters of runtime faults, passed to the simulator's fault model (which checks them).
RUNTIME_PARAMS = ("multiplier", "probability", "affects", "status", "retry_after_s", "stall_s")
RUNTIME_FAULT_FIELDS = fault_parameters()
TITAN_REPLICA = "titan"  # targets: "titan" (the first replica) or "titan-1" ... "titan-N"


class Backend(Settings):
    """An upstream: simulated (started as ``titan simulate`` on a free port) or real (``url``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    simulated: SimulationProfile | None = None
    # Simulated only: answers at once, as an engine's batch limit (more wait their turn).
    max_concurrency: int | None = Field(None, ge=1)
    url: str | None = None  # a real OpenAI-compatible server, e.g. http://vllm:8000/v1
    # A real backend that is a `titan simulate --allow-fault-control`: faults may target it.
    fault_control: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> Backend:
        if (self.simulated is None) == (self.url is None):
            raise ValueError(f"backend {self.name!r} needs exactly one of 'simulated' or 'url'")
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"backend {self.name!r}: url must start with http(s)://")
            if self.max_concurrency is not None:
                raise ValueError(f"backend {self.name!r}: max_concurrency is for simulated ones")
        elif self.fault_control:
            raise ValueError(f"backend {self.name!r}: fault_control is for url backends")
        return self

    @property
    def is_simulated(self) -> bool:
        return self.simulated is not None

    @property
    def takes_runtime_faults(self) -> bool:
        return self.is_simulated or self.fault_control


class TitanSpec(Settings):
    replicas: int = Field(1, ge=1, le=8)
    # A titan.yaml, except where it listens: deployments name a backend with `upstream: NAME`.
    config: dict[str, Any] = Field(default_factory=dict)


class LoadStage(Settings):
    duration_s: float = Field(gt=0)
    rate: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1)


class LoadSpec(Settings):
    model: str | list[str]  # several: the load is split evenly over them
    rate: float | None = Field(None, gt=0)  # requests/s, an open loop
    concurrency: int | None = Field(None, ge=1)  # clients, a closed loop
    burstiness: float = Field(1.0, gt=0)  # open loop: 1 Poisson, below 1 burstier
    workload: str = "chat"
    max_tokens: int = Field(16, ge=1)
    stream: bool = True
    timeout_s: float = Field(15.0, gt=0)  # the client's, per request (not scaled)
    # Before the timeline's 0, not measured, not scaled: Titan's latency windows and hedge
    # budget fill up as in a long-running process.
    warmup_s: float = Field(2.0, ge=0)
    seed: int = 0
    api_key: str | None = None
    # One after another from 0; each may change the rate or concurrency. None: one stage.
    stages: list[LoadStage] = Field(default_factory=list)

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model,) if isinstance(self.model, str) else tuple(self.model)

    @property
    def is_closed_loop(self) -> bool:
        """Whether any stage has clients (concurrency) rather than a rate."""
        if not self.stages:
            return self.concurrency is not None
        return any(
            stage.concurrency is not None or (stage.rate is None and self.concurrency is not None)
            for stage in self.stages
        )

    @model_validator(mode="after")
    def _arrivals(self) -> LoadSpec:
        if not self.models:
            raise ValueError("load.model names at least one model")
        if self.rate is not None and self.concurrency is not None:
            raise ValueError("load: rate (open loop) or concurrency (closed loop), not both")
        for index, stage in enumerate(self.stages):
            if stage.rate is not None and stage.concurrency is not None:
                raise ValueError(f"load.stages[{index}]: rate or concurrency, not both")
            if (stage.rate or self.rate) is None and (
                stage.concurrency or self.concurrency
            ) is None:
                raise ValueError(f"load.stages[{index}] has no rate or concurrency")
        if not self.stages and self.rate is None and self.concurrency is None:
            raise ValueError("load needs a rate (requests/s) or a concurrency (clients)")
        return self


class FaultSpec(Settings):
    """One fault on the timeline, maybe repeated ``times`` every ``every_s``."""

    id: str | None = None  # what assertions' `during` names; default "<kind>:<target>"
    at_s: float = Field(ge=0)
    kind: FaultKind
    target: str
    duration_s: float | None = Field(None, gt=0)  # runtime faults: how long it lasts
    down_s: float | None = Field(None, ge=0)  # kill_restart: how long the process stays dead
    every_s: float | None = Field(None, gt=0)
    times: int = Field(1, ge=1)
    multiplier: float | None = None
    probability: float | None = None
    affects: str | None = None
    status: int | None = None
    retry_after_s: float | None = None
    stall_s: float | None = None

    @property
    def name(self) -> str:
        return self.id or f"{self.kind}:{self.target}"

    @property
    def is_runtime(self) -> bool:
        return self.kind in FAULT_KINDS

    @property
    def params(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in RUNTIME_PARAMS if getattr(self, key) is not None}

    @model_validator(mode="after")
    def _fits_its_kind(self) -> FaultSpec:
        params = self.params
        if self.is_runtime:
            if self.duration_s is None:
                raise ValueError(f"a {self.kind} fault needs duration_s")
            if self.down_s is not None:
                raise ValueError("down_s is for kill_restart faults")
            self.runtime_fault()  # the simulator's own checks of the parameters
        else:
            if params or self.duration_s is not None:
                extra = ", ".join([*params, *(["duration_s"] if self.duration_s else [])])
                raise ValueError(f"a {self.kind} fault takes no {extra}")
            if (self.kind == "kill_restart") != (self.down_s is not None):
                raise ValueError("kill_restart needs down_s; other kinds take none")
        if self.times > 1 and self.every_s is None:
            raise ValueError("a fault repeated (times > 1) needs every_s")
        return self

    def runtime_fault(self) -> Fault:
        try:
            return RUNTIME_FAULT.validate_python(
                {"kind": self.kind, "duration_s": self.duration_s, **self.params}
            )
        except ValidationError as exc:  # say which parameter, in the scenario's words
            raise ValueError("; ".join(self._problem(e) for e in exc.errors())) from None

    def _problem(self, error: Any) -> str:
        key = ".".join(str(part) for part in error["loc"][1:])
        if error["type"] == "extra_forbidden":
            fields = RUNTIME_FAULT_FIELDS[self.kind]
            return f"a {self.kind} fault takes no {key!r} (its parameters: {', '.join(fields)})"
        return f"{key}: {error['msg']}"

    def occurrences(self) -> list[float]:
        """When each repetition starts."""
        return [self.at_s + index * (self.every_s or 0.0) for index in range(self.times)]


class AssertionSpec(Settings):
    """``check``: ``METRIC[(ARG)] OP NUMBER``, e.g. ``p99_ttft_ms <= 500`` (see checks.py)."""

    check: str
    name: str | None = None
    during: str | None = None  # a fault's id: requests sent while it was in force
    extend_s: float = Field(0.0, ge=0)  # ...and this long after each occurrence
    window: tuple[float, float] | None = None  # [start_s, end_s) on the timeline
    model: str | None = None  # only the load's requests for this model

    @field_validator("check")
    @classmethod
    def _readable(cls, value: str) -> str:
        parse_check(value)  # raises ValueError naming the problem
        return value


class SloSpec(Settings):
    """What slo_attainment and goodput_rps count as good (vLLM's definitions), in seconds."""

    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2e_s: float | None = Field(None, gt=0)


class ReportSpec(Settings):
    window_s: float = Field(1.0, gt=0)  # the report's timeline bins
    sample_every_s: float = Field(0.5, gt=0)  # Titan's /metrics and the backends' /stats


class Scenario(Settings):
    name: str
    description: str = ""
    duration_s: float = Field(gt=0)
    backends: list[Backend]
    titan: TitanSpec = TitanSpec()
    load: LoadSpec
    faults: list[FaultSpec] = Field(default_factory=list)
    slo: SloSpec = SloSpec()
    assertions: list[AssertionSpec] = Field(default_factory=list)
    report: ReportSpec = ReportSpec()

    @field_validator("assertions", mode="before")
    @classmethod
    def _shorthands(cls, value: Any) -> Any:
        """``- "p99_ttft_ms <= 500"`` and ``- {breaker_opened: b, ...}`` are shorthands."""
        if not isinstance(value, list):
            return value
        return [_expand_assertion(item) for item in value]

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        names = [backend.name for backend in self.backends]
        if not names:
            raise ValueError("a scenario needs at least one backend")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(repeated)}")
        if (
            self.load.stages
            and abs(sum(s.duration_s for s in self.load.stages) - self.duration_s) > 1e-6
        ):
            raise ValueError("load.stages' durations must add up to duration_s")
        backends = {backend.name: backend for backend in self.backends}
        replicas = self.replica_names()
        fault_ids = {fault.name for fault in self.faults}
        for index, fault in enumerate(self.faults):
            _check_target(index, fault, backends, replicas)
            if fault.occurrences()[-1] >= self.duration_s:
                raise ValueError(f"faults[{index}] starts after the run ends (duration_s)")
            is_replica = fault.target == TITAN_REPLICA or fault.target in replicas
            if is_replica and self.load.is_closed_loop:
                # A closed-loop client sends its next request as soon as one fails: on a dead
                # replica, thousands a second of refused connections, starving the machine.
                raise ValueError(
                    f"faults[{index}]: killing a Titan replica needs an open-loop load "
                    "(load.rate), not load.concurrency"
                )
        for index, assertion in enumerate(self.assertions):
            if assertion.during is not None and assertion.during not in fault_ids:
                known = ", ".join(sorted(fault_ids)) or "none"
                raise ValueError(
                    f"assertions[{index}].during: no fault {assertion.during!r} (faults: {known})"
                )
            if assertion.model is not None and assertion.model not in self.load.models:
                raise ValueError(f"assertions[{index}].model: the load does not ask for it")
            if assertion.window is not None and not assertion.window[0] < assertion.window[1]:
                raise ValueError(f"assertions[{index}].window: [start_s, end_s) with start < end")
        return self

    def replica_names(self) -> list[str]:
        return [f"{TITAN_REPLICA}-{index + 1}" for index in range(self.titan.replicas)]

    def scaled(self, factor: float) -> Scenario:
        """The same scenario with every time on its timeline multiplied by ``factor``."""
        if not factor > 0:
            raise ValueError(f"the time scale must be above 0, not {factor}")

        def times(spec: Settings, *keys: str) -> dict[str, Any]:
            return {k: getattr(spec, k) * factor for k in keys if getattr(spec, k) is not None}

        stages = [s.model_copy(update=times(s, "duration_s")) for s in self.load.stages]
        load = self.load.model_copy(update={"stages": stages})
        faults = [
            f.model_copy(update=times(f, "at_s", "duration_s", "down_s", "every_s"))
            for f in self.faults
        ]
        assertions = []
        for assertion in self.assertions:
            window = assertion.window
            if window is not None:
                window = (window[0] * factor, window[1] * factor)
            update = {**times(assertion, "extend_s"), "window": window}
            assertions.append(assertion.model_copy(update=update))
        window_s = self.report.window_s * factor
        # At least two samples a window, so that each window sees the breakers.
        sample_every_s = min(self.report.sample_every_s, window_s / 2)
        report = self.report.model_copy(
            update={"window_s": window_s, "sample_every_s": sample_every_s}
        )
        update = {"duration_s": self.duration_s * factor, "load": load, "faults": faults}
        return self.model_copy(update={**update, "assertions": assertions, "report": report})


def _expand_assertion(item: Any) -> Any:
    if isinstance(item, str):
        return {"check": item}
    if isinstance(item, dict) and "breaker_opened" in item:
        rest = {k: v for k, v in item.items() if k != "breaker_opened"}
        return {"check": f"breaker_openings({item['breaker_opened']}) >= 1", **rest}
    return item


def _check_target(
    index: int, fault: FaultSpec, backends: dict[str, Backend], replicas: list[str]
) -> None:
    where = f"faults[{index}] ({fault.kind})"
    target = fault.target
    is_replica = target == TITAN_REPLICA or target in replicas
    if not is_replica and target not in backends:
        known = ", ".join([*backends, *replicas])
        raise ValueError(f"{where}: unknown target {target!r} (targets: {known})")
    if fault.is_runtime:
        if is_replica:
            raise ValueError(f"{where}: Titan replicas take only kill, restart and kill_restart")
        if not backends[target].takes_runtime_faults:
            raise ValueError(
                f"{where}: {target!r} is a real backend without fault_control: only simulated "
                "ones (or a `titan simulate --allow-fault-control` with fault_control: true) can"
            )
    elif not is_replica and not backends[target].is_simulated:
        raise ValueError(f"{where}: only processes the run started can be killed or restarted")
