"""Where an ``openai`` deployment's model server reports its own load: the Prometheus endpoint
Titan scrapes, and the metric names to read there (a known server's, or the deployment's own)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator, model_validator

from titan.config.settings import Settings

ModelServer = Literal["vllm", "sglang", "tgi", "titan"]


def _names(value: Any) -> Any:
    """One name or a list of alternatives (the first one the server exports is read)."""
    return (value,) if isinstance(value, str) else value


Names = Annotated[tuple[str, ...], BeforeValidator(_names)]


class MetricNames(Settings):
    """Sample names as the exposition prints them (counters with their ``_total``). Each field
    lists alternatives, newest first: the first one present in a scrape is read. Empty: the
    server does not report it."""

    waiting: Names = ()  # requests queued in the server, summed over series
    running: Names = ()  # requests in the server's batch, summed over series
    kv_usage: Names = ()  # KV-cache usage, 0..1, averaged over series
    # Prefix-cache hit rate, from two counters' deltas between scrapes...
    prefix_hits: Names = ()
    prefix_queries: Names = ()
    # ...or, where the server has no such counters, a gauge of the rate (0..1, averaged).
    prefix_hit_rate: Names = ()
    # The label that names the model (``model_name`` in vLLM and SGLang): with the deployment's
    # ``metrics.model_name`` set, only series carrying that value are read.
    model_label: str | None = None


class DeploymentMetrics(Settings):
    """A deployment's ``metrics`` block: scrape its model server's load (docs/vllm.md)."""

    enabled: bool = True
    # None: the base_url's origin + /metrics (http://vllm:8000/v1 -> http://vllm:8000/metrics).
    url: str | None = None
    server: ModelServer = "vllm"  # whose metric names to read
    names: MetricNames | None = None  # fields set here replace the server's
    # Read only the series whose model label has this value (None: sum over every series).
    model_name: str | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {value!r}")
        return value

    def resolved_url(self, base_url: str) -> str:
        if self.url is not None:
            return self.url
        parts = urlsplit(base_url)
        return f"{parts.scheme}://{parts.netloc}/metrics"


class LoadScrapeConfig(Settings):
    """How often the model servers' metrics are read (``routing.load``)."""

    interval_s: float = Field(0.5, gt=0)
    # Each wait is interval_s times a factor drawn from [1 - jitter, 1 + jitter], so replicas
    # scraped by many gateways are not hit in lockstep.
    jitter: float = Field(0.2, ge=0, lt=1)
    timeout_s: float = Field(1.0, gt=0)
    # A reading older than this is no reading: routing falls back to what it knows itself.
    stale_after_s: float = Field(3.0, gt=0)

    @model_validator(mode="after")
    def _fresh_enough(self) -> LoadScrapeConfig:
        longest_wait = self.interval_s * (1 + self.jitter)
        if self.stale_after_s <= longest_wait:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s:g}) must exceed the longest wait between "
                f"scrapes, interval_s x (1 + jitter) = {longest_wait:g}, or every reading is stale"
            )
        return self
