"""The scoring router's settings (``routing.scored``): what each score weighs, the prefix index,
the filters, and how a decision is explained."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from titan.config.settings import Settings


class ScoreWeights(Settings):
    """A candidate's total is the weighted sum of its scores, each in 0..1."""

    prefix: float = Field(3.0, ge=0)  # share of the prompt's leading blocks it probably holds
    # Above prefix's weight, so that a long enough queue outweighs a full prefix hit.
    queue: float = Field(4.0, ge=0)  # requests it holds, against the least loaded candidate
    kv: float = Field(1.0, ge=0)  # 1 - KV-cache usage (its server's, when fresh)
    latency: float = Field(1.0, ge=0)  # the fastest candidate's EWMA TTFB over its own

    @model_validator(mode="after")
    def _one_counts(self) -> ScoreWeights:
        if not any((self.prefix, self.queue, self.kv, self.latency)):
            raise ValueError("at least one of prefix, queue, kv, latency must be > 0")
        return self


class PrefixIndexConfig(Settings):
    """Which deployment probably holds which prompt prefix, from Titan's own routing history."""

    # The prompt's text is cut into blocks of this many characters (~64 tokens at 4 a token),
    # each hashed with the one before, so equal hashes mean equal whole prefixes.
    block_chars: int = Field(256, ge=16)
    # How many blocks a deployment's cache holds, least recently routed ones forgotten first
    # (a deployment's own ``prefix_cache_blocks`` overrides it): ~2M characters, ~512k tokens.
    capacity_blocks: int = Field(8192, ge=1)


class ScoredRoutingConfig(Settings):
    weights: ScoreWeights = ScoreWeights()
    prefix: PrefixIndexConfig = PrefixIndexConfig()
    # The queue score falls from 1 (the least loaded candidate) to 0 at this many more requests
    # (per unit of weight): with the default weights a full prefix hit is worth 12 queued ones.
    queue_scale: float = Field(16.0, gt=0)
    # A prompt of at least long_prompt_tokens (4 characters a token) skips deployments whose
    # fresh KV-cache usage is at or above kv_full: it would wait for blocks or preempt others.
    kv_full: float = Field(0.95, gt=0, le=1)
    long_prompt_tokens: int = Field(1024, ge=1)
    # Equal totals: the first in the model's deployment order, or one drawn at random.
    tie_break: Literal["first", "random"] = "random"
    # Debug: every answer carries an ``x-titan-route`` header with each candidate's scores.
    debug_header: bool = False
    # /stats keeps each model's last this many decisions, every candidate's scores in each.
    explain_last: int = Field(20, ge=0, le=1000)
