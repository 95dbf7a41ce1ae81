"""The composition root: builds the backends, the router's registry, admission, the cache and
the request path (RequestFlow) with the services beside it, and starts and stops them.

Nothing here runs a request: the API calls the services ``start`` built (``Pipeline.services``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan.backends import Backend, create_backend
from titan.cache.embedder import Embedder
from titan.cache.response_cache import ResponseCache
from titan.config import ALL_UPSTREAM_MODELS, ModelConfig, OpenAIDeployment, TitanConfig
from titan.context.retention_sweep import RetentionSweeper
from titan.errors import ServiceUnavailableError
from titan.limits.usage import UsageLedger
from titan.limits.usage_buffer import UsageBuffer
from titan.observability.collectors import LiveState, SemanticBudgetState
from titan.observability.metrics import TitanMetrics
from titan.observability.tracing import Tracer
from titan.router.deployment import DeploymentState
from titan.router.registry import Registry, RoutedModel
from titan.router.retry import HedgeBudget
from titan.service.admin import AdminService
from titan.service.admission import Admission
from titan.service.agents import AgentService
from titan.service.attempts import AttemptRunner
from titan.service.authentication import Authenticator
from titan.service.caching import CacheStep
from titan.service.dashboard import Dashboard
from titan.service.degradation import DegradationLadders
from titan.service.guard import Guardrails
from titan.service.jobs import JobsService
from titan.service.load_scraper import LoadScrapers, ScrapeTarget, scrape_target
from titan.service.observing import RequestObserver
from titan.service.policy import PolicyCheck
from titan.service.probes import run_probes
from titan.service.rag import RagService
from titan.service.requests import Gates, RequestFlow
from titan.service.responses import ResponsesService
from titan.service.served_models import ServedModels
from titan.service.storage_health import StorageHealth
from titan.storage import Storage, open_storage
from titan.storage.memory_cache import MemoryCache

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Services:
    """What ``Pipeline.start`` builds for the API: the request path and the services beside it."""

    flow: RequestFlow
    responses: ResponsesService
    jobs: JobsService
    rag: RagService
    admin: AdminService
    agents: AgentService


class Pipeline:
    def __init__(
        self,
        config: TitanConfig,
        *,
        backend_factory: Callable[..., Backend] = create_backend,
        now: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        storage: Storage | None = None,
    ):
        self.config = config
        self.storage = storage
        self._owns_storage = False  # close only a storage it opened itself
        self.metrics = TitanMetrics(frozenset(config.tenants))
        self.metrics.watch(LiveState(self.stats))
        self.metrics.watch(
            SemanticBudgetState(lambda: self._cache.budget.report() if self._cache else {})
        )
        self.tracer = Tracer(config.observability.tracing)
        # Hooks are imported here: a missing one fails at startup, not on a request.
        self.guard = Guardrails(config.guardrails, self.metrics)
        # The live dashboard's sampler: started by its first look, stopped by shutdown.
        self.dashboard = Dashboard(self.metrics.registry.collect, self.stats)
        self._factory = backend_factory
        self._now = now
        self._rng = rng or random.Random()
        # (model config, deployment index, backend) for every configured deployment.
        self._planned: list[tuple[ModelConfig, int, Backend]] = [
            (model, index, self._create(model, index, model.name))
            for model in config.models
            for index in range(len(model.deployments))
        ]
        self.services: Services | None = None  # built by start(): then it serves requests
        self._registry: Registry | None = None
        self._embedder: Embedder | None = None
        self._embedder_loading = asyncio.Lock()
        self._cache: ResponseCache | None = None
        # What start() built so far, for shutdown (also after a failed start).
        self._health: StorageHealth | None = None
        self._admission: Admission | None = None
        self._degradation: DegradationLadders | None = None
        self._cache_step: CacheStep | None = None
        self._observer: RequestObserver | None = None
        self._rag: RagService | None = None
        self._jobs: JobsService | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._scrape_targets: list[ScrapeTarget] = []  # filled as the registry is built
        self._scrapers: LoadScrapers | None = None
        self._sweeper: RetentionSweeper | None = None  # purges expired data (data_at_rest)

    def _create(self, model: ModelConfig, index: int, name: str | None) -> Backend:
        deployment = model.deployments[index]
        label = deployment.name or f"{name or deployment.backend}-{index}"
        return self._factory(deployment, model_name=name, name=label)

    @property
    def is_ready(self) -> bool:
        return self._registry is not None and all(b.is_ready for b in self.backends())

    async def storage_unreachable(self) -> str | None:
        """Why the shared storage cannot be reached now (a PING at most once a second), or
        None: /ready answers 503 while it is not."""
        if self._health is None or not self.config.admission.ready_requires_storage:
            return None
        return await self._health.unreachable_reason()

    def backends(self) -> list[Backend]:
        if self._registry is None:
            return [backend for _, _, backend in self._planned]
        return [d.backend for m in self._registry.models.values() for d in m.deployments]

    def model_ids(self) -> list[str]:
        """The served models, once started (none while they load)."""
        return list(self._registry.models) if self._registry is not None else []

    async def start(self) -> None:
        """Open the storage, start every backend (model loads happen here; this can take a
        while), discover the models of wildcard upstreams, then start admission, routing, the
        request path, the services and the health probes."""
        if self.storage is None:
            self.storage = await open_storage(
                self.config.storage, data_at_rest=self.config.data_at_rest
            )
            self._owns_storage = True
        storage, config, now = self.storage, self.config, self._now
        await asyncio.gather(*(backend.start() for _, _, backend in self._planned))
        registry, capacities = await self._served_models()
        await self._load_classifiers(registry)
        self._health = health = StorageHealth(storage, self.metrics, now=now)
        auth = Authenticator(config, storage, health, now=now)
        usage = UsageLedger(storage.counters)
        pending_usage = UsageBuffer(
            usage,
            on_error=lambda exc: health.failed(
                "usage", exc, action="keeps usage in memory and retries every second"
            ),
        )
        self._admission = admission = Admission(
            config, storage.limits, pending_usage, self.metrics, health, now=now
        )
        self._degradation = degradation = DegradationLadders(config, self.metrics, now=now)
        degradation.start(capacities)
        admission.start(capacities)
        # Refuses to serve a non-loopback address without keys.
        await auth.start()
        runner = AttemptRunner(
            registry, config.retry, config.hedge, now=now, rng=self._rng, tracer=self.tracer
        )
        await self._start_cache()
        self._cache_step = CacheStep(self._cache, config, self.metrics, health)  # type: ignore[arg-type]
        self._observer = RequestObserver(config, self.metrics, self.tracer)
        gates = Gates(
            auth, PolicyCheck(config, usage, pending_usage, health), degradation, admission
        )
        flow = RequestFlow(
            config, ServedModels(registry, self._embedder), gates, self._cache_step,
            runner, self._observer, guard=self.guard, now=now,
        )  # fmt: skip
        self._rag = RagService(auth, storage.documents, self._embedder_loaded)
        self._jobs = JobsService(config.jobs, storage, auth, flow, admission, self.metrics)
        self.services = Services(
            flow,
            ResponsesService(flow, auth, storage.documents, self._rag, config.context),
            self._jobs,
            self._rag,
            AdminService(auth, usage, pending_usage, self._cache),
            AgentService(auth, storage.documents),
        )
        # Everything loaded so far (modules, weights' metadata, the cache index) lives as long
        # as the process: the collector's full passes need not walk it (they showed as 10 ms
        # stalls in cache lookups at 100,000 entries).
        gc.collect()
        gc.freeze()
        self._registry = registry  # last: a registry means ready to route
        if config.probes.enabled:
            self._probe_task = asyncio.create_task(run_probes(registry, config.probes))
        self._scrapers = LoadScrapers(self._scrape_targets, rng=self._rng)
        self._scrapers.start()
        if storage.jobs is not None:
            if config.jobs.workers:
                self._jobs.start_worker()
            else:
                self._jobs.start_upkeep()
        self._sweeper = RetentionSweeper(
            storage, self._rag.served_stores, interval_s=config.data_at_rest.sweep_interval_s,
            now=time.time,
        )  # fmt: skip
        self._sweeper.start()

    async def _served_models(self) -> tuple[Registry, dict[str, int | None]]:
        """The registry of the served models (wildcard upstreams' discovered), and each model's
        concurrency cap for admission."""
        models: dict[str, list[DeploymentState]] = {}
        configs: dict[str, ModelConfig] = {}
        for model, index, backend in self._planned:
            if model.name == ALL_UPSTREAM_MODELS:
                await self._discover(model, index, backend, models, configs)
                continue
            name = model.name or backend.model_ids[0]
            models.setdefault(name, []).append(self._state(model, index, backend))
            configs[name] = model
        registry = Registry(
            (self._routed(name, states, configs[name]) for name, states in models.items()),
            self._rng,
        )
        return registry, {name: _capacity(configs[name], states) for name, states in models.items()}

    async def _discover(
        self,
        model: ModelConfig,
        index: int,
        backend: Backend,
        models: dict[str, list[DeploymentState]],
        configs: dict[str, ModelConfig],
    ) -> None:
        deployment = model.deployments[index]
        assert isinstance(deployment, OpenAIDeployment)
        listed = await backend.list_models()  # type: ignore[attr-defined]
        await backend.shutdown()  # the discovery client; each model gets its own below
        if not listed:
            raise ServiceUnavailableError(f"{deployment.base_url} lists no models to serve")
        for name in listed:
            served = self._create(model, index, name)
            await served.start()
            models.setdefault(name, []).append(self._state(model, index, served))
            configs[name] = model.model_copy(update={"name": name})
        logger.info("serving the upstream's models", extra={"models": listed})

    async def _embedder_loaded(self) -> Embedder:
        async with self._embedder_loading:  # concurrent first uses load the model once
            if self._embedder is None:
                self._embedder = await asyncio.to_thread(Embedder.load)
                kind = getattr(self._embedder, "kind", type(self._embedder).__name__)
                logger.info("embedding model loaded", extra={"embedder": kind})
        return self._embedder

    async def _start_cache(self) -> None:
        """The response cache on the storage's cache store; the embedding model only when some
        model caches semantically."""
        configs = [m.cache or self.config.cache for m in self.config.models]
        semantic = [c.semantic for c in [*configs, self.config.cache] if c.semantic.enabled]
        embedder = await self._embedder_loaded() if semantic else None
        verifying = [s for s in semantic if s.pair_verifier]
        if embedder is not None and verifying:
            weights = next(
                (s.pair_verifier_weights for s in verifying if s.pair_verifier_weights), None
            )
            # In the background: loaded, or trained once per machine first.
            embedder.start_verifier(weights_file=Path(weights).expanduser() if weights else None)
        store = self.storage.cache or MemoryCache()  # type: ignore[union-attr]
        self._cache = ResponseCache(store, embedder=embedder)
        await self._cache.start()

    async def _load_classifiers(self, registry: Registry) -> None:
        """Embed the examples of similarity tier rules, if any (loads the embedding model)."""
        models = [m for m in registry.models.values() if m.classifies_by_similarity]
        if not models:
            return
        embedder = await self._embedder_loaded()
        for model in models:
            model.tier_examples = [
                await asyncio.to_thread(embedder.encode, list(rule.similar_to))
                if rule.similar_to
                else []
                for rule in model.tiers
            ]

    def _state(self, model: ModelConfig, index: int, backend: Backend) -> DeploymentState:
        deployment = model.deployments[index]
        discovered = backend.model_ids[0] if model.name == ALL_UPSTREAM_MODELS else None
        load = (model.routing or self.config.routing).load
        target = scrape_target(
            deployment, backend.name, load, now=self._now, discovered_model=discovered
        )
        if target is not None:
            self._scrape_targets.append(target)
        return DeploymentState.create(
            backend.name,
            backend,
            weight=deployment.weight,
            max_concurrency=deployment.max_concurrency,
            timeouts=deployment.timeouts,
            breaker=self.config.breaker,
            now=self._now,
            pool=deployment.pool,
            load=target.tracker if target is not None else None,
            prefix_cache_blocks=deployment.prefix_cache_blocks,
        )

    def _routed(self, name: str, states: list[DeploymentState], model: ModelConfig) -> RoutedModel:
        return RoutedModel(
            name=name,
            deployments=states,
            routing=model.routing or self.config.routing,
            fallbacks=list(model.fallbacks),
            splits=list(model.splits),
            tiers=list(model.tiers),
            hedge_budget=HedgeBudget(self.config.hedge),
        )

    async def shutdown(self) -> None:
        await self.dashboard.stop()
        if self._jobs is not None:  # first: running jobs go back to the queue while it is open
            await self._jobs.stop()
        if self._sweeper is not None:
            await self._sweeper.stop()
        if self._probe_task is not None:
            self._probe_task.cancel()
            await asyncio.gather(self._probe_task, return_exceptions=True)
        if self._scrapers is not None:
            await self._scrapers.stop()
        for backend in self.backends():
            try:
                await backend.shutdown()
            except Exception:
                logger.exception("backend shutdown failed", extra={"backend": backend.name})
        if self._rag is not None:
            await self._rag.close()
        if self._cache_step is not None:
            await self._cache_step.close()
        if self._observer is not None:
            self._observer.close()  # the last request lines leave
        if self._cache is not None:
            await self._cache.close()
        if self._admission is not None:
            await self._admission.close()
        if self.storage is not None and self._owns_storage:
            await self.storage.close()
        self.tracer.shutdown()  # the last spans leave

    def stats(self) -> dict[str, Any]:
        if self._registry is None:
            return {}
        admission, degradation = self._admission, self._degradation
        return {
            name: {
                "requests": model.num_requests,
                "served_as_fallback": model.num_fallbacks,
                "hedges": model.hedge_budget.num_hedges,
                "admission": {
                    "queue": admission.queue_snapshot(name) if admission else None,
                    "degradation": degradation.snapshot(name) if degradation else None,
                },
                "deployments": {
                    d.name: {
                        **d.snapshot(),
                        "backend": d.backend.stats() if d.backend.is_ready else {},
                    }
                    for d in model.deployments
                },
                **({"routing": model.scoring.snapshot()} if model.scoring else {}),
            }
            for name, model in self._registry.models.items()
        }


def _capacity(model: ModelConfig, states: list[DeploymentState]) -> int | None:
    """Requests the model runs at once before admission queues: its max_concurrency, else the
    sum of its deployments' (when each has one), else no cap."""
    if model.max_concurrency is not None:
        return model.max_concurrency
    caps = [d.max_concurrency for d in states]
    return None if None in caps else sum(caps)  # type: ignore[arg-type]


def build_pipeline(config: TitanConfig) -> Pipeline:
    return Pipeline(config)
