"""The systems of the gateway benchmark and how each is started: simulated upstreams (``titan
simulate``), Titan (``titan serve --config``) and the LiteLLM proxy, with the profiles and
configs they run with. Everything is written to a work folder, so the report can show it."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan.chaos import processes
from titan.chaos.processes import Service, Services

MODEL = "sim"  # what clients ask for, everywhere
UPSTREAM_TIMEOUT_S = 30.0  # each proxy's per-request upstream timeout
TITAN_START_TIMEOUT_S = 60.0
SIMULATOR_START_TIMEOUT_S = 30.0
LITELLM_START_TIMEOUT_S = 180.0  # it imports a lot: ~10 s on a quiet 2-core machine
DEFAULT_LITELLM = Path("/work/litellm-venv/bin/litellm")

# Run it offline, quietly and without a database. A master key is mandatory since 1.7x (it
# refuses to start without one); the benchmark makes a random one per run.
LITELLM_ENV = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "true",  # the bundled cost map, not a fetch from GitHub
    "LITELLM_TELEMETRY_DISABLED": "true",
}


def steady_profile() -> dict[str, Any]:
    """A fixed 20 ms to the answer; a stream's 16 chunks follow at once."""
    return {"seed": 0, "ttft_s": 0.02, "inter_token_s": 0.0, "output_tokens": 16}


def faulty_profile(outage_start_s: float, outage_duration_s: float) -> dict[str, Any]:
    """The steady upstream plus 5% latency spikes ×20, 3% 503s (each request on its own: no
    bursts) and an outage that resets every connection."""
    return {
        **steady_profile(),
        "seed": 5,
        "spike_probability": 0.05,
        "spike_multiplier": 20,
        "error_probability": 0.03,
        "error_status": 503,
        "error_burst_s": 0.0,
        "retry_after_s": 1.0,
        "outages": [{"start_s": outage_start_s, "duration_s": outage_duration_s, "status": None}],
    }


def _server(port: int) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": port, "log_level": "warning"}


def _openai_deployment(name: str, base_url: str) -> dict[str, Any]:
    return {
        "backend": "openai",
        "name": name,
        "base_url": f"{base_url}/v1",
        "upstream_model": MODEL,
    }


def titan_overhead_config(port: int, upstream_url: str) -> dict[str, Any]:
    """One deployment; probes and hedging off, so nothing but the proxying is measured."""
    return {
        "server": _server(port),
        "models": [{"name": MODEL, "deployments": [_openai_deployment("upstream", upstream_url)]}],
        "hedge": {"enabled": False},
        "probes": {"enabled": False},
    }


def titan_transients_config(port: int, first_url: str, second_url: str) -> dict[str, Any]:
    """Two deployments and nothing else: routing, retries, hedging, breakers and probes at
    their defaults."""
    deployments = [_openai_deployment("first", first_url), _openai_deployment("second", second_url)]
    return {"server": _server(port), "models": [{"name": MODEL, "deployments": deployments}]}


def titan_defaults() -> dict[str, Any]:
    """The settings a config without those sections gets, for the report."""
    from titan.config import TitanConfig

    config = TitanConfig()
    sections = ("routing", "retry", "hedge", "breaker", "probes")
    return {name: getattr(config, name).model_dump(mode="json") for name in sections}


def litellm_config(upstream_urls: list[str], *, with_retries: bool) -> dict[str, Any]:
    deployments = [
        {
            "model_name": MODEL,
            "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"{url}/v1", "api_key": "x"},
        }
        for url in upstream_urls
    ]
    config: dict[str, Any] = {
        "model_list": deployments,
        "litellm_settings": {"request_timeout": UPSTREAM_TIMEOUT_S},
        "general_settings": {"disable_spend_logs": True},
    }
    if with_retries:
        config["router_settings"] = {
            "num_retries": 2,
            "allowed_fails": 3,
            "cooldown_time": 10,
            "retry_after": 0,
        }
    return config


def default_litellm() -> str | None:
    if DEFAULT_LITELLM.exists():
        return str(DEFAULT_LITELLM)
    return shutil.which("litellm")


def litellm_version(litellm: str) -> str:
    """The version of the litellm package in the proxy's own environment (its script's
    interpreter, from the shebang)."""
    try:
        first_line = Path(litellm).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    if not first_line.startswith("#!"):
        return "unknown"
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    try:
        result = subprocess.run(
            [*first_line[2:].split(), "-c", code], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


@dataclass
class Workspace:
    """Where configs, profiles, scripts and logs go during a run."""

    root: Path

    @property
    def log_dir(self) -> Path:
        path = self.root / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_yaml(self, name: str, data: dict[str, Any]) -> Path:
        import yaml

        path = self.root / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.root / name
        path.write_text(text)
        return path


def start_simulator(
    services: Services, workspace: Workspace, name: str, profile: dict[str, Any], port: int
) -> Service:
    profile_path = workspace.write_yaml(f"{name}.profile.yaml", profile)
    argv = processes.titan_argv(
        "simulate", "--port", str(port), "--profile", str(profile_path), "--model", MODEL
    )
    return services.start(
        name,
        argv,
        f"http://127.0.0.1:{port}",
        workspace.log_dir,
        ready_path="/health",
        timeout_s=SIMULATOR_START_TIMEOUT_S,
    )


def start_titan(
    services: Services, workspace: Workspace, name: str, config: dict[str, Any]
) -> Service:
    config_path = workspace.write_yaml(f"{name}.titan.yaml", config)
    port = config["server"]["port"]
    return services.start(
        name,
        processes.titan_argv("serve", "--config", str(config_path)),
        f"http://127.0.0.1:{port}",
        workspace.log_dir,
        ready_path="/ready",
        timeout_s=TITAN_START_TIMEOUT_S,
    )


def start_litellm(
    services: Services,
    workspace: Workspace,
    name: str,
    litellm: str,
    config: dict[str, Any],
    port: int,
    api_key: str,
) -> Service:
    config_path = workspace.write_yaml(f"{name}.litellm.yaml", config)
    argv = [litellm, "--config", str(config_path), "--port", str(port), "--num_workers", "1"]
    env = {**LITELLM_ENV, "LITELLM_MASTER_KEY": api_key}
    return services.start(
        name,
        argv,
        f"http://127.0.0.1:{port}",
        workspace.log_dir,
        ready_path="/health/liveliness",
        timeout_s=LITELLM_START_TIMEOUT_S,
        env=env,
        # No database: a DATABASE_URL in the caller's shell would make it connect to one.
        unset_env=("DATABASE_URL",),
        env_shown={**LITELLM_ENV, "LITELLM_MASTER_KEY": "<random per run>"},
        cwd=workspace.root,  # no stray .env file of the caller's is read
    )


def new_api_key() -> str:
    return "sk-titan-bench-" + secrets.token_hex(16)
