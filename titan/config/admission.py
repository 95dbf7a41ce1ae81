"""Admission settings: storage, API keys and tenants, limits, the admission queue, degradation
and prices."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from titan.config.settings import Settings

# Interactive traffic goes first, then normal, then batch work (jobs).
Priority = Literal["interactive", "normal", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "normal", "batch")

# Durable documents and counters in SQLite, hot limit counters in memory: one process.
DEFAULT_STORAGE = "sqlite:///~/.local/share/titan/titan.db"


class Limits(Settings):
    """Requests and tokens per minute, and requests at once; None: no such limit."""

    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)


class Budget(Settings):
    """Spending cap: requests are refused (429 insufficient_quota) once ``usd`` is spent in the
    current ``period`` (UTC calendar day or month, or ever)."""

    usd: float = Field(gt=0)
    period: Literal["day", "month", "total"] = "month"


class TenantConfig(Limits):
    """Limits shared by every key of the tenant (on top of each key's own)."""

    budget: Budget | None = None


class AuthConfig(Settings):
    # Needed for /admin/*; "${TITAN_MASTER_KEY}" in files. None: the admin API is off.
    master_key: SecretStr | None = None
    # Serve without API keys on a non-loopback address (otherwise refused at start).
    allow_unauthenticated: bool = False
    # Per client IP, for requests without a key (auth off); none by default.
    anonymous: Limits = Limits()
    # Key lookups are cached this long per replica: a revocation takes at most this to apply.
    key_cache_s: float = Field(5.0, ge=0)
    # While the storage is unreachable, a key this replica validated within this many seconds is
    # still accepted from its cache (revocations made meanwhile apply when the storage returns);
    # any other key is refused with 503 storage_unavailable. 0: refuse every key.
    key_stale_if_error_s: float = Field(300.0, ge=0)


class AdmissionConfig(Settings):
    # Waiting requests per model beyond its concurrency cap; more are refused at once (503).
    max_queue: int = Field(256, ge=0)
    # A request's deadline unless its x-titan-deadline header sets one: refused at once when its
    # predicted wait exceeds it, dropped when it passes while queued.
    default_deadline_s: float = Field(60.0, gt=0)
    default_priority: Priority = "normal"
    # Concurrency slots are leases of this length, renewed every third of it while their request
    # runs: a replica that dies frees its slots within this time, however long its requests were.
    # At least 3 s (a renewal a second at most); a store outage longer than 2/3 of it lets the
    # leases lapse, so other replicas may over-admit until it ends.
    lease_ttl_s: float = Field(30.0, ge=3)
    # Tokens/min limits reserve the prompt plus max_tokens; a request without max_tokens reserves
    # this many output tokens (settled with the actual count afterwards).
    reserved_output_tokens: int = Field(256, ge=1)
    # While the shared storage (Redis) is unreachable: fail_open admits requests without their
    # rate, token, concurrency limits and budgets (counted in titan_storage_errors_total, logged
    # once per outage); fail_closed refuses them (503 storage_unavailable). Authentication always
    # fails closed, except for keys this replica validated recently
    # (auth.key_stale_if_error_s).
    on_storage_error: Literal["fail_open", "fail_closed"] = "fail_open"
    # /ready answers 503 while the storage is unreachable (a PING at most once a second). Off by
    # default: every replica shares the storage, so a 503 from all of them would take the whole
    # service out of its load balancer and fail_open would help no one; the outage shows in
    # titan_storage_errors_total instead.
    ready_requires_storage: bool = False


class ModelLimits(Limits):
    """Per model: limits over all its traffic (every key and tenant together)."""


class Price(Settings):
    """USD per million tokens, for usage cost and budgets."""

    prompt_per_1m: float = Field(0.0, ge=0)
    completion_per_1m: float = Field(0.0, ge=0)


# relax_structured_output: response_format / guided_* requests run unconstrained (constrained
# decoding costs CPU per token; the client sees x-titan-degraded and validates the output).
DegradationAction = Literal[
    "fallback_model", "cap_max_tokens", "cache_only", "relax_structured_output"
]


class DegradationStep(Settings):
    """One step of the degradation ladder, applied to requests of ``priorities``."""

    action: DegradationAction
    priorities: tuple[Priority, ...] = ("normal", "batch")
    model: str | None = None  # fallback_model: the smaller model to route to
    max_tokens: int | None = Field(None, ge=1)  # cap_max_tokens
    reply: str | None = None  # cache_only: the answer when nothing is cached

    @model_validator(mode="after")
    def _has_its_setting(self) -> DegradationStep:
        needed = {"fallback_model": "model", "cap_max_tokens": "max_tokens"}.get(self.action)
        if needed is not None and getattr(self, needed) is None:
            raise ValueError(f"the {self.action} step needs '{needed}'")
        return self


class DegradationConfig(Settings):
    """Under sustained overload, apply ``steps`` one by one; undo them with hysteresis.

    Overload: the p95 queue wait or time to first token over the last ``window_s`` stays above
    its SLO for ``sustain_s``. Each further ``sustain_s`` of overload adds the next step; each
    ``sustain_s`` with both p95s under ``recover_ratio`` × their SLO removes the last one.
    """

    queue_wait_p95_s: float | None = Field(None, gt=0)
    ttft_p95_s: float | None = Field(None, gt=0)
    window_s: float = Field(10.0, gt=0)
    sustain_s: float = Field(5.0, gt=0)
    recover_ratio: float = Field(0.7, gt=0, lt=1)
    steps: list[DegradationStep] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_a_trigger(self) -> DegradationConfig:
        if self.steps and self.queue_wait_p95_s is None and self.ttft_p95_s is None:
            raise ValueError("degradation needs queue_wait_p95_s or ttft_p95_s to trigger it")
        return self


class ContextConfig(Settings):
    """Server-side conversations: with ``summary_model`` set, turns that trimming drops are
    replaced by a running summary that this (configured) model writes."""

    summary_model: str | None = None
    summary_max_tokens: int = Field(128, ge=8)
    # Share of the prompt budget freed when a conversation must be trimmed; the turns after
    # keep the same prefix until they fill it again (prefix-cache hits), at the cost of
    # sending fewer old turns. 0: always keep the most that fits (every turn past the window
    # then recomputes the whole prompt: docs/ARCHITECTURE.md, "Trimming").
    trim_headroom: float = Field(0.5, ge=0, lt=1)
    # Most tokens a server-side conversation's prompt (instructions, the turns kept, the new
    # input) may hold; trimming drops the oldest turns beyond it. Never more than the model's
    # window leaves after the turn's output; a request with truncation "disabled" is held to the
    # model's window alone. None: the model's window, except an embedded engine on a CPU: 4,096,
    # where attention over a longer history makes late turns 2.5-3.6x slower than the first
    # (README, "Trimming").
    conversation_window: int | None = Field(None, ge=256)
    # When trimming drops turns, an embedded engine copies the KV of the turns it keeps from
    # the conversation's last request (keys rotated to their new positions) instead of
    # computing them again: approximate (that KV was computed with the dropped turns in front),
    # like llama.cpp's context shift. false: recompute exactly (README, "Trimming").
    context_shift: bool = True
