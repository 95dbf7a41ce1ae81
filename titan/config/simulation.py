"""A simulated backend's behaviour: latencies and the transients it injects, all seeded."""

from __future__ import annotations

from pydantic import Field, model_validator

from titan.config.settings import Settings


class Outage(Settings):
    """The backend refuses every connection (or answers 503) for ``duration_s`` seconds,
    ``start_s`` seconds after it starts."""

    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    status: int | None = Field(None, ge=400, le=599)  # None: connections are reset


class StepCostProfile(Settings):
    """One engine step's seconds: fixed + per_token·tokens + per_pair·attention pairs +
    per_seq·sequences (titan.planning's LinearStepCost; ``titan plan`` calibrates one)."""

    fixed_s: float = Field(0.005, ge=0)  # weights read once per step
    per_token_s: float = Field(0.00003, ge=0)  # matmuls: prefill and decode tokens alike
    per_pair_s: float = Field(0.0, ge=0)  # attention (query, key) pairs: long contexts
    per_seq_s: float = Field(0.0, ge=0)  # sampling and bookkeeping per sequence


class ModelServerProfile(Settings):
    """A vLLM-like model server: a KV cache of ``kv_cache_tokens`` in blocks, prefix caching,
    continuous batching under a step-cost model, a waiting queue. Its timings replace the
    profile's ``ttft_s``, ``inter_token_s``, spikes and stalls; errors and outages still apply."""

    kv_cache_tokens: int = Field(65_536, ge=1)
    block_size: int = Field(16, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    enable_prefix_caching: bool = True
    step_cost: StepCostProfile = StepCostProfile()

    @model_validator(mode="after")
    def _holds_a_block(self) -> ModelServerProfile:
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block (block_size)")
        return self

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size


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
    # None: scripted latencies (above). Set: a model server decides them (opt-in).
    server: ModelServerProfile | None = None
