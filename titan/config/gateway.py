"""The gateway's settings: models, their deployments, routing and transient control.

A *model* is the name clients send; it is served by one or more *deployments* (an embedded
engine, an OpenAI-compatible upstream, or a simulated backend), chosen per request by the routing
policy, retried, hedged and failed over as configured here.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from titan.config.admission import (
    DEFAULT_STORAGE,
    AdmissionConfig,
    AuthConfig,
    ContextConfig,
    DegradationConfig,
    ModelLimits,
    Price,
    TenantConfig,
)
from titan.config.cache import CacheConfig
from titan.config.data_at_rest import DataAtRestConfig
from titan.config.guardrails import GuardrailsConfig
from titan.config.jobs import JobsConfig
from titan.config.observability import ObservabilityConfig, SloConfig
from titan.config.replica_metrics import DeploymentMetrics, LoadScrapeConfig
from titan.config.routing_scores import ScoredRoutingConfig
from titan.config.settings import ClientConfig, EmbeddedModelConfig, ServerConfig, Settings
from titan.config.simulation import SimulationProfile


class Timeouts(Settings):
    connect_s: float = Field(5.0, gt=0)
    # No first byte (first chunk, or the whole answer) within this: the attempt is retried.
    # None: no such limit (total_s still bounds the request).
    first_byte_s: float | None = Field(60.0, gt=0)
    # A started stream that goes quiet this long is cut (the stall watchdog).
    stall_s: float = Field(30.0, gt=0)
    total_s: float = Field(600.0, gt=0)


class _Deployment(Settings):
    name: str | None = None  # default: "<model>-<index>"
    weight: float = Field(1.0, gt=0)
    max_concurrency: int | None = Field(None, ge=1)
    timeouts: Timeouts = Timeouts()
    # Which traffic it takes: "batch" deployments serve batch-class requests (jobs) and other
    # requests only when no other deployment is up; "interactive" ones never serve batch
    # requests; "shared" ones serve both (batch requests when no batch deployment is up).
    pool: Literal["shared", "interactive", "batch"] = "shared"
    # routing.policy scored: how many prompt blocks its model server's prefix cache holds
    # (None: routing.scored.prefix.capacity_blocks).
    prefix_cache_blocks: int | None = Field(None, ge=1)


class EmbeddedTimeouts(Timeouts):
    # The engine runs in this process and fails loudly, never silently: a request it is still
    # prefilling (a long prompt on a slow CPU) is making progress and must not be cut by a
    # first-byte timer meant for remote servers that hang.
    first_byte_s: float | None = Field(None, gt=0)


class EmbeddedDeployment(_Deployment):
    backend: Literal["embedded"] = "embedded"
    engine: EmbeddedModelConfig = EmbeddedModelConfig()
    timeouts: EmbeddedTimeouts = EmbeddedTimeouts()
    # tool_choice "required" with parallel calls allowed: the most calls one reply may hold (a
    # small model repeats a call until it is stopped).
    max_tool_calls: int = Field(8, ge=1, le=128)


class OpenAIDeployment(_Deployment):
    """Any OpenAI-compatible upstream: vLLM, SGLang, TGI, Ollama, llama.cpp's server, OpenAI."""

    backend: Literal["openai"]
    base_url: str  # e.g. http://vllm:8000/v1
    upstream_model: str | None = None  # default: the model's name
    api_key: SecretStr | None = None  # "${ENV}" in files; never logged
    # Extra request headers; often credentials, so kept out of repr() (and masked by describe).
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    # Features this upstream cannot honour get a clear 400 instead of silence.
    unsupported_fields: tuple[str, ...] = ()
    # The model server's own load (queue, batch, KV cache), scraped from its Prometheus
    # endpoint; None: not scraped (OpenAI and most hosted APIs have no such endpoint).
    metrics: DeploymentMetrics | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class SimulatedDeployment(_Deployment):
    backend: Literal["simulated"]
    profile: SimulationProfile = SimulationProfile()


Deployment = Annotated[
    EmbeddedDeployment | OpenAIDeployment | SimulatedDeployment, Field(discriminator="backend")
]

RoutingPolicy = Literal[
    "p2c_ewma", "round_robin", "least_outstanding", "session_affinity", "prefix_affinity", "scored"
]


class RoutingConfig(Settings):
    policy: RoutingPolicy = "p2c_ewma"
    # prefix_affinity: the prompt's first this many characters choose the deployment...
    prefix_chars: int = Field(1024, ge=1)
    # ...unless its outstanding requests exceed the least loaded one's by this factor (+1).
    imbalance_factor: float = Field(2.0, ge=1.0)
    # How often deployments with a ``metrics`` block are scraped, and when a reading is stale.
    load: LoadScrapeConfig = LoadScrapeConfig()
    # scored: a weighted sum of prefix-cache, queue, KV and latency scores (docs/routing.md).
    scored: ScoredRoutingConfig = ScoredRoutingConfig()


class RetryConfig(Settings):
    max_attempts: int = Field(3, ge=1)  # attempts in all, the first one included
    backoff_base_s: float = Field(0.05, ge=0)
    backoff_max_s: float = Field(2.0, ge=0)
    # Besides connection errors and timeouts: upstream statuses worth another attempt.
    retry_on_status: tuple[int, ...] = (429, 500, 502, 503, 504)


class HedgeConfig(Settings):
    enabled: bool = True
    # A second attempt starts when the first has no first byte after this percentile of the
    # model's live time-to-first-byte...
    percentile: float = Field(95.0, gt=0, lt=100)
    min_delay_s: float = Field(0.02, ge=0)
    # ...and only while hedges stay under this share of all attempts.
    max_fraction: float = Field(0.1, ge=0, le=1)


class BreakerConfig(Settings):
    consecutive_errors: int = Field(5, ge=1)
    error_rate: float = Field(0.5, gt=0, le=1)
    min_requests: int = Field(20, ge=1)  # in the window, before error_rate can trip
    window_s: float = Field(30.0, gt=0)
    # Opens when the p95 time to first byte over the window exceeds this (None: never).
    ttfb_p95_s: float | None = Field(None, gt=0)
    open_s: float = Field(10.0, gt=0)  # before a half-open probe
    half_open_requests: int = Field(1, ge=1)


class ProbeConfig(Settings):
    enabled: bool = True
    interval_s: float = Field(10.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)


class SplitConfig(Settings):
    """A canary: this share of the model's traffic goes to another configured model."""

    model: str
    weight: float = Field(gt=0, le=1)  # a share of the traffic: 0.1 sends one request in ten


class TierRule(Settings):
    """Tiered routing: a request matching the rule goes to ``model``."""

    model: str
    # Prompts up to this many tokens, estimated at 4 characters a token (OpenAI's rule of thumb:
    # the gateway has no tokenizer for upstream models).
    max_prompt_tokens: int | None = Field(None, ge=1)
    pattern: str | None = None  # a regular expression searched in the last user message
    # An embedding classifier: the last user message goes to ``model`` when its embedding
    # (all-MiniLM-L6-v2) has a cosine similarity of at least ``min_similarity`` with one of these.
    similar_to: tuple[str, ...] = ()
    min_similarity: float = Field(0.6, gt=-1, le=1)

    @model_validator(mode="after")
    def _one_condition(self) -> TierRule:
        conditions = (self.max_prompt_tokens is not None, self.pattern is not None)
        if sum(conditions) + bool(self.similar_to) != 1:
            raise ValueError(
                "a tier rule needs exactly one of max_prompt_tokens, pattern or similar_to"
            )
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern is not a valid regular expression: {exc}") from None
        return self


class ModelConfig(Settings):
    # The name clients send. None only for a single embedded deployment: the engine's name.
    name: str | None = None
    deployments: list[Deployment] = Field(default_factory=lambda: [EmbeddedDeployment()])
    # Other models, tried in order once every deployment failed.
    fallbacks: list[str] = Field(default_factory=list)
    routing: RoutingConfig | None = None  # None: the global routing
    splits: list[SplitConfig] = Field(default_factory=list)
    tiers: list[TierRule] = Field(default_factory=list)
    # Admission: limits over all the model's traffic, and requests at once before they queue
    # (None: the sum of the deployments' max_concurrency, if each has one; else no queue).
    limits: ModelLimits = ModelLimits()
    max_concurrency: int | None = Field(None, ge=1)
    price: Price | None = None
    degradation: DegradationConfig | None = None
    cache: CacheConfig | None = None  # None: the global cache settings
    slo: SloConfig | None = None  # None: observability.slo

    @field_validator("deployments")
    @classmethod
    def _not_empty(cls, value: list[Deployment]) -> list[Deployment]:
        if not value:
            raise ValueError("a model needs at least one deployment")
        return value

    @field_validator("splits")
    @classmethod
    def _shares(cls, value: list[SplitConfig]) -> list[SplitConfig]:
        total = sum(split.weight for split in value)
        if total > 1:
            raise ValueError(f"split weights are shares of the traffic and add up to {total:g} > 1")
        return value


# A model with this name serves every model its upstream lists (``titan serve --upstream URL``).
ALL_UPSTREAM_MODELS = "*"


class TitanConfig(Settings):
    server: ServerConfig = ServerConfig()
    client: ClientConfig = ClientConfig()  # where `titan jobs` and `titan bench URL` send
    models: list[ModelConfig] = Field(default_factory=lambda: [ModelConfig()])
    routing: RoutingConfig = RoutingConfig()
    retry: RetryConfig = RetryConfig()
    hedge: HedgeConfig = HedgeConfig()
    breaker: BreakerConfig = BreakerConfig()
    probes: ProbeConfig = ProbeConfig()
    # memory://, sqlite:///path (default: durable keys and usage), redis://host:port/db (replicas)
    storage: str = DEFAULT_STORAGE
    data_at_rest: DataAtRestConfig = DataAtRestConfig()  # encryption keys, retention per kind
    auth: AuthConfig = AuthConfig()
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    admission: AdmissionConfig = AdmissionConfig()
    cache: CacheConfig = CacheConfig()
    context: ContextConfig = ContextConfig()
    jobs: JobsConfig = JobsConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    guardrails: GuardrailsConfig = GuardrailsConfig()

    @model_validator(mode="after")
    def _consistent(self) -> TitanConfig:
        # Messages name the key path (models[i]...) because the loader shows them under the file.
        unnamed = [i for i, m in enumerate(self.models) if m.name is None]
        for i in unnamed:
            deployments = self.models[i].deployments
            if len(deployments) != 1 or deployments[0].backend != "embedded":
                raise ValueError(
                    f"models[{i}]: only a model with one embedded deployment may omit its name"
                )
        if len(unnamed) > 1:
            raise ValueError("at most one model may omit its name")
        names = [m.name for m in self.models if m.name is not None]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique; repeated: {', '.join(duplicates)}")
        for i, model in enumerate(self.models):
            _check_references(i, model, set(names))
        return self


def _check_references(index: int, model: ModelConfig, known: set[str]) -> None:
    """Fallbacks, splits and tiers name other configured models, never ``*`` or themselves."""
    if model.name == ALL_UPSTREAM_MODELS:
        backends = {d.backend for d in model.deployments}
        if backends != {"openai"}:
            raise ValueError(
                f"models[{index}]: the model '*' (every model the upstream lists) needs openai "
                f"deployments only, not {', '.join(sorted(backends - {'openai'}))}"
            )
    targets = [(f"fallbacks[{j}]", name) for j, name in enumerate(model.fallbacks)]
    targets += [(f"splits[{j}].model", split.model) for j, split in enumerate(model.splits)]
    targets += [(f"tiers[{j}].model", tier.model) for j, tier in enumerate(model.tiers)]
    if model.degradation is not None:
        targets += [
            (f"degradation.steps[{j}].model", step.model)
            for j, step in enumerate(model.degradation.steps)
            if step.model is not None
        ]
    for key, target in targets:
        where = f"models[{index}].{key}"
        if target == ALL_UPSTREAM_MODELS:
            raise ValueError(f"{where}: the model '*' cannot be a fallback, split or tier target")
        if target == model.name:
            raise ValueError(f"{where}: model {target!r} refers to itself")
        if target not in known:
            close = difflib.get_close_matches(target, sorted(known), n=1)
            known_list = ", ".join(sorted(known))
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {known_list})"
            raise ValueError(f"{where}: unknown model {target!r}{hint}")
