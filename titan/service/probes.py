"""Active health checks: every deployment is probed on an interval, and the result feeds its
circuit breaker, so an ejected replica comes back without a client request risked on it."""

from __future__ import annotations

import asyncio
import logging

from titan.config import ProbeConfig
from titan.router.deployment import DeploymentState
from titan.router.registry import Registry

logger = logging.getLogger(__name__)


async def probe_once(deployment: DeploymentState, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            await deployment.backend.probe()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        deployment.breaker.record_probe(is_healthy=False)
        logger.info("probe failed", extra={"deployment": deployment.name, "error": str(exc)})
        return False
    deployment.breaker.record_probe(is_healthy=True)
    return True


async def run_probes(registry: Registry, config: ProbeConfig) -> None:
    """Probe every deployment every ``interval_s`` until cancelled."""
    deployments = [d for model in registry.models.values() for d in model.deployments]
    while True:
        await asyncio.sleep(config.interval_s)
        await asyncio.gather(*(probe_once(d, config.timeout_s) for d in deployments))
