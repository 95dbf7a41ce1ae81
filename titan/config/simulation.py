"""A simulated backend's behaviour: latencies and the transients it injects, all seeded."""

from __future__ import annotations

from pydantic import Field

from titan.config.settings import Settings


class Outage(Settings):
    """The backend refuses every connection (or answers 503) for ``duration_s`` seconds,
    ``start_s`` seconds after it starts."""

    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    status: int | None = Field(None, ge=400, le=599)  # None: connections are reset


class SimulationProfile(Settings):
    seed: int = 0
    ttft_s: float = Field(0.02, ge=0)  # time to first token (non-streaming: to the answer)
    inter_token_s: float = Field(0.0, ge=0)
    output_tokens: int = Field(16, ge=1)  # unless max_tokens asks for fewer
    # Latency spikes: with this probability a request's TTFT and gaps are multiplied.
    spike_probability: float = Field(0.0, ge=0, le=1)
    spike_multiplier: float = Field(10.0, ge=1)
    # Errors: with this probability an error burst starts and lasts burst_s seconds; every
    # request in it gets ``error_status`` (with Retry-After for 429 and 503).
    error_probability: float = Field(0.0, ge=0, le=1)
    error_status: int = Field(503, ge=400, le=599)
    error_burst_s: float = Field(0.0, ge=0)
    retry_after_s: float = Field(1.0, ge=0)
    # Stalls: with this probability a stream stops after its first token for stall_s seconds.
    stall_probability: float = Field(0.0, ge=0, le=1)
    stall_s: float = Field(60.0, gt=0)
    # Resets: with this probability the connection drops before any byte.
    reset_probability: float = Field(0.0, ge=0, le=1)
    outages: tuple[Outage, ...] = ()
