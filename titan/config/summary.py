"""A config in a few lines of plain text (``titan config check``), secrets shown as ``***``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from titan.config.data_at_rest import DataAtRestConfig
from titan.config.gateway import (
    ALL_UPSTREAM_MODELS,
    BreakerConfig,
    Deployment,
    EmbeddedDeployment,
    HedgeConfig,
    ModelConfig,
    OpenAIDeployment,
    ProbeConfig,
    RetryConfig,
    RoutingConfig,
    TierRule,
    TitanConfig,
)
from titan.config.guardrails import GuardrailsConfig
from titan.config.simulation import SimulationProfile

SECRET_MASK = "***"


def describe(config: TitanConfig) -> str:
    """Models → deployments, fallbacks, splits, tiers, then the routing and transient settings."""
    server = config.server
    lines = [f"server: {server.host}:{server.port}, log level {server.log_level}", "models:"]
    for model in config.models:
        lines += _model(model)
    lines += [
        f"routing: {_routing(config.routing)}",
        f"retry: {_retry(config.retry)}",
        f"hedge: {_hedge(config.hedge)}",
        f"breaker: {_breaker(config.breaker)}",
        f"probes: {_probes(config.probes)}",
        f"storage: {shown_url(config.storage)}",
        f"data at rest: {_data_at_rest(config.data_at_rest)}",
        f"guardrails: {_guardrails(config.guardrails)}",
    ]
    return "\n".join(lines)


def _model(model: ModelConfig) -> list[str]:
    if model.name is None:
        title = "(the embedded engine's model name)"
    elif model.name == ALL_UPSTREAM_MODELS:
        title = "* (every model the upstream lists)"
    else:
        title = model.name
    if model.routing is not None:
        title += f" [routing: {_routing(model.routing)}]"
    lines = [f"  {title}"]
    for index, deployment in enumerate(model.deployments):
        name = deployment.name or f"{model.name or 'embedded'}-{index}"
        lines.append(f"    - {name}: {_deployment(deployment)}")
    if model.fallbacks:
        lines.append(f"    fallbacks: {' -> '.join(model.fallbacks)}")
    if model.splits:
        splits = ", ".join(f"{s.model} (weight {s.weight:g})" for s in model.splits)
        lines.append(f"    splits: {splits}")
    for tier in model.tiers:
        lines.append(f"    tier: {_tier_rule(tier)} -> {tier.model}")
    return lines


def _tier_rule(tier: TierRule) -> str:
    if tier.max_prompt_tokens is not None:
        return f"prompt <= ~{tier.max_prompt_tokens} tokens"
    if tier.pattern is not None:
        return f"last user message matches /{tier.pattern}/"
    return (
        f"last user message similar (>= {tier.min_similarity:g}) to one of "
        f"{len(tier.similar_to)} examples"
    )


def _deployment(deployment: Deployment) -> str:
    if isinstance(deployment, OpenAIDeployment):
        parts = [f"openai {deployment.base_url}"]
        if deployment.upstream_model:
            parts.append(f"upstream model {deployment.upstream_model}")
        parts.append(f"api key {SECRET_MASK if deployment.api_key else 'none'}")
        if deployment.headers:
            # Header values often carry credentials: names only.
            parts.append("headers " + ", ".join(f"{h}={SECRET_MASK}" for h in deployment.headers))
        if deployment.unsupported_fields:
            parts.append(f"unsupported fields {', '.join(deployment.unsupported_fields)}")
        metrics = deployment.metrics
        if metrics is not None and metrics.enabled:
            url = metrics.resolved_url(deployment.base_url)
            parts.append(f"load from {url} ({metrics.server} names)")
    elif isinstance(deployment, EmbeddedDeployment):
        engine = deployment.engine
        parts = [f"embedded {engine.model or 'bundled SmolLM2-135M-Instruct'}"]
        settings = {k: v for k, v in engine.explicit_settings().items() if k != "model"}
        if "kv_cache_bytes" in settings:
            settings["kv_cache_bytes"] = f"{settings['kv_cache_bytes'] / 2**20:g}MiB"
        parts += [f"{key} {value}" for key, value in settings.items()]
    else:
        parts = [f"simulated {_profile(deployment.profile)}"]
    parts.append(f"weight {deployment.weight:g}")
    if deployment.max_concurrency is not None:
        parts.append(f"max concurrency {deployment.max_concurrency}")
    timeouts = deployment.timeouts
    if timeouts != type(timeouts)():  # not the backend's defaults
        first_byte = "none" if timeouts.first_byte_s is None else f"{timeouts.first_byte_s:g}s"
        parts.append(
            f"timeouts connect {timeouts.connect_s:g}s, first byte {first_byte}, "
            f"stall {timeouts.stall_s:g}s, total {timeouts.total_s:g}s"
        )
    return ", ".join(parts)


def _profile(profile: SimulationProfile) -> str:
    parts = [f"(seed {profile.seed}, ttft {profile.ttft_s:g}s"]
    if profile.spike_probability:
        parts.append(f"spikes {profile.spike_probability:.0%} x{profile.spike_multiplier:g}")
    if profile.error_probability:
        parts.append(f"errors {profile.error_probability:.0%} ({profile.error_status})")
    if profile.stall_probability:
        parts.append(f"stalls {profile.stall_probability:.0%}")
    if profile.reset_probability:
        parts.append(f"resets {profile.reset_probability:.0%}")
    if profile.outages:
        parts.append(f"{len(profile.outages)} outage(s)")
    if profile.server is not None:
        parts.append(f"model server: {profile.server.kv_cache_tokens}-token KV cache")
    return ", ".join(parts) + ")"


def _routing(routing: RoutingConfig) -> str:
    if routing.policy == "prefix_affinity":
        return (
            f"prefix_affinity (first {routing.prefix_chars} chars, "
            f"unless load is {routing.imbalance_factor:g}x imbalanced)"
        )
    if routing.policy == "scored":
        w = routing.scored.weights
        return (
            f"scored (prefix {w.prefix:g}, queue {w.queue:g}, kv {w.kv:g}, latency {w.latency:g}"
            f"; {routing.scored.prefix.block_chars}-char prefix blocks)"
        )
    return routing.policy


def _retry(retry: RetryConfig) -> str:
    statuses = ", ".join(str(s) for s in retry.retry_on_status) or "none"
    return (
        f"up to {retry.max_attempts} attempts, backoff {retry.backoff_base_s:g}s doubling to "
        f"{retry.backoff_max_s:g}s with full jitter; on connection errors, timeouts and "
        f"statuses {statuses}"
    )


def _hedge(hedge: HedgeConfig) -> str:
    if not hedge.enabled:
        return "off"
    return (
        f"after the live p{hedge.percentile:g} time to first byte (at least "
        f"{hedge.min_delay_s:g}s), at most {hedge.max_fraction:.0%} of attempts"
    )


def _breaker(breaker: BreakerConfig) -> str:
    text = (
        f"opens after {breaker.consecutive_errors} consecutive errors or "
        f"{breaker.error_rate:.0%} errors over {breaker.window_s:g}s "
        f"(at least {breaker.min_requests} requests)"
    )
    if breaker.ttfb_p95_s is not None:
        text += f" or p95 time to first byte over {breaker.ttfb_p95_s:g}s"
    return (
        text + f"; half-open after {breaker.open_s:g}s with {breaker.half_open_requests} "
        "trial request(s)"
    )


def _probes(probes: ProbeConfig) -> str:
    if not probes.enabled:
        return "off"
    return f"every {probes.interval_s:g}s, timeout {probes.timeout_s:g}s"


def _data_at_rest(data: DataAtRestConfig) -> str:
    # The keys are secrets: how many, never what (nor a fingerprint).
    num_keys = len(data.encryption_keys)
    if num_keys:
        text = f"encrypted (AES-256-GCM), {num_keys} key(s) {SECRET_MASK}, the first seals"
    else:
        text = "not encrypted"
    kept = data.retention.seconds_by_kind()
    if kept:
        text += "; retention " + ", ".join(f"{kind} {_days(s)}" for kind, s in kept.items())
    return text


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds:g}s"


def _guardrails(guardrails: GuardrailsConfig) -> str:
    if not guardrails.policies:
        return "off"
    policies = guardrails.policies
    return "; ".join(f"{p.name}: {p.action} {'+'.join(p.stages)}" for p in policies)


def shown_url(url: str) -> str:
    """A storage URL for messages: its password masked; a SQLite path under ``~`` made
    absolute, so that the user sees which file it is."""
    head = "sqlite:///"
    if url.lower().startswith(head) and url[len(head) :].startswith("~"):
        return head + str(Path(url[len(head) :]).expanduser())
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL at all; opening it says what is wrong
        return url
    if password is None:
        return url
    user = f"{parts.username}:{SECRET_MASK}@" if parts.username else f":{SECRET_MASK}@"
    return urlunsplit(parts._replace(netloc=user + parts.netloc.rsplit("@", 1)[1]))
