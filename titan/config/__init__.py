"""Titan's configuration: typed, frozen pydantic models, unknown keys rejected.

``TitanConfig`` is the root; with no file it serves the embedded SmolLM2 model.
"""

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
    SimulatedDeployment,
    SplitConfig,
    TierRule,
    Timeouts,
    TitanConfig,
)
from titan.config.loading import config_from_mapping, describe, load_config
from titan.config.replica_metrics import (
    DeploymentMetrics,
    LoadScrapeConfig,
    MetricNames,
    ModelServer,
)
from titan.config.routing_scores import PrefixIndexConfig, ScoredRoutingConfig, ScoreWeights
from titan.config.settings import (
    EmbeddedModelConfig,
    LogLevel,
    RequestLimits,
    ServerConfig,
    Settings,
    parse_byte_size,
)
from titan.config.simulation import Outage, SimulationProfile

__all__ = [
    "ALL_UPSTREAM_MODELS",
    "BreakerConfig",
    "Deployment",
    "DeploymentMetrics",
    "EmbeddedDeployment",
    "EmbeddedModelConfig",
    "HedgeConfig",
    "LoadScrapeConfig",
    "LogLevel",
    "MetricNames",
    "ModelConfig",
    "ModelServer",
    "OpenAIDeployment",
    "Outage",
    "PrefixIndexConfig",
    "ProbeConfig",
    "RequestLimits",
    "RetryConfig",
    "RoutingConfig",
    "ScoreWeights",
    "ScoredRoutingConfig",
    "ServerConfig",
    "Settings",
    "SimulatedDeployment",
    "SimulationProfile",
    "SplitConfig",
    "TierRule",
    "Timeouts",
    "TitanConfig",
    "config_from_mapping",
    "describe",
    "load_config",
    "parse_byte_size",
]
