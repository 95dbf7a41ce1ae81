"""Simulated backends: seeded latency, spikes, error bursts, stalls, outages and resets.

One simulation logic (``behaviour``: a plan per request; ``pacing``: sleeping it) serves both the
in-process backend (``titan.backends.simulated``) and the standalone OpenAI-compatible server
(``titan.simulate.server``, ``titan simulate``), which is imported on its own so that the
in-process backend does not pull in the HTTP stack.
"""

from titan.simulate.behaviour import (
    Failure,
    FailureCause,
    FailureKind,
    RequestPlan,
    Simulation,
    Stopwatch,
    num_output_tokens,
    retry_after_header,
)
from titan.simulate.counters import SimulationCounters
from titan.simulate.pacing import ConnectionCut, Pacer

__all__ = [
    "ConnectionCut",
    "Failure",
    "FailureCause",
    "FailureKind",
    "Pacer",
    "RequestPlan",
    "Simulation",
    "SimulationCounters",
    "Stopwatch",
    "num_output_tokens",
    "retry_after_header",
]
