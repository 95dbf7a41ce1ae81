"""The titan.yaml a scenario's Titan runs with: the scenario's ``titan.config`` with each
``upstream: NAME`` deployment turned into an ``openai`` deployment of that backend's URL, and
where to listen (loopback, a free port) and what to store in (``memory://`` unless it says).
Checked with Titan's own loader when the scenario loads, so a bad key fails before anything
starts, with Titan's message."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from titan.chaos.scenario import Scenario
from titan.config.resolution import resolve_settings
from titan.errors import ConfigError

DEFAULT_STORAGE = "memory://"
DEFAULT_LOG_LEVEL = "warning"
_PLACEHOLDER_PORT = 9  # only for checking: never connected to


def titan_config(scenario: Scenario, upstream_urls: Mapping[str, str], port: int) -> dict[str, Any]:
    """``upstream_urls``: backend name -> its OpenAI base URL (``http://host:port/v1``)."""
    config = copy.deepcopy(scenario.titan.config)
    server = dict(config.get("server") or {})
    server.update(host="127.0.0.1", port=port)
    server.setdefault("log_level", DEFAULT_LOG_LEVEL)
    config["server"] = server
    config.setdefault("storage", DEFAULT_STORAGE)
    models = config.get("models")
    if isinstance(models, list):
        config["models"] = [_model(i, m, upstream_urls) for i, m in enumerate(models)]
    return config


def check_titan_config(
    scenario: Scenario, source: str, environ: Mapping[str, str] | None = None
) -> None:
    """Raises ConfigError with every problem (Titan's messages, under ``titan.config``)."""
    if "models" not in scenario.titan.config:
        raise ConfigError(f"{source}: titan.config needs models (with upstream deployments)")
    urls = {
        backend.name: backend.url or f"http://127.0.0.1:{_PLACEHOLDER_PORT}/v1"
        for backend in scenario.backends
    }
    try:
        config = titan_config(scenario, urls, _PLACEHOLDER_PORT)
        # As its replicas will read it: `titan serve --config` with this process's variables.
        resolve_settings(document=(config, f"{source}: titan.config"), environ=environ)
    except ConfigError as exc:
        message = "; ".join(exc.message.splitlines())
        raise ConfigError(
            message if message.startswith(source) else f"{source}: {message}"
        ) from None


def _model(index: int, model: Any, upstream_urls: Mapping[str, str]) -> Any:
    if not isinstance(model, dict) or not isinstance(model.get("deployments"), list):
        return model  # Titan's loader says what is wrong with it
    deployments = [
        _deployment(f"models[{index}].deployments[{j}]", deployment, upstream_urls)
        for j, deployment in enumerate(model["deployments"])
    ]
    return {**model, "deployments": deployments}


def _deployment(where: str, deployment: Any, upstream_urls: Mapping[str, str]) -> Any:
    if not isinstance(deployment, dict) or "upstream" not in deployment:
        return deployment  # a plain Titan deployment (embedded, openai...), used as written
    rest = {key: value for key, value in deployment.items() if key != "upstream"}
    name = deployment["upstream"]
    if name not in upstream_urls:
        known = ", ".join(upstream_urls)
        raise ConfigError(f"titan.config.{where}.upstream: no backend {name!r} (backends: {known})")
    if "backend" in rest or "base_url" in rest:
        raise ConfigError(
            f"titan.config.{where}: 'upstream' sets backend and base_url; remove those keys"
        )
    return {"backend": "openai", "name": name, "base_url": upstream_urls[name], **rest}
