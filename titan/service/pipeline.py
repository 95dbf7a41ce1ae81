"""The request pipeline: resolve the model, then run the request on its deployments.

Later steps (authenticate, admit, context, cache, record) slot in around ``_route`` and the
runner; routes stay thin because everything between parsing and serializing happens here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from titan.backends import Backend, create_backend
from titan.cache.embedder import Embedder
from titan.cache.response_cache import ResponseCache
from titan.config import ALL_UPSTREAM_MODELS, ModelConfig, OpenAIDeployment, TitanConfig
from titan.context.retention_sweep import RetentionSweeper
from titan.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    ServiceUnavailableError,
)
from titan.observability.collectors import LiveState, SemanticBudgetState
from titan.observability.metrics import TitanMetrics
from titan.observability.tracing import Tracer
from titan.protocol import Answer, ClientRequest, ModelCard, ModelList
from titan.router.deployment import DeploymentState
from titan.router.registry import Registry, RoutedModel
from titan.router.retry import HedgeBudget
from titan.service.admission import Gatekeeper
from titan.service.attempts import AttemptRunner, Routed
from titan.service.caching import CacheStep
from titan.service.guard import Guardrails
from titan.service.observing import RequestObserver
from titan.service.probes import run_probes
from titan.service.requests import RequestFlow
from titan.service.traits import request_traits
from titan.storage import Storage, open_storage
from titan.storage.memory_cache import MemoryCache

logger = logging.getLogger(__name__)


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
            SemanticBudgetState(lambda: self.cache.budget.report() if self.cache else {})
        )
        self.tracer = Tracer(config.observability.tracing)
        # Hooks are imported here: a missing one fails at startup, not on a request.
        self.guard = Guardrails(config.guardrails, self.metrics)
        self.gate: Gatekeeper | None = None
        self._factory = backend_factory
        self._now = now
        self._rng = rng or random.Random()
        # (model config, deployment index, backend) for every configured deployment.
        self._planned: list[tuple[ModelConfig, int, Backend]] = [
            (model, index, self._create(model, index, model.name))
            for model in config.models
            for index in range(len(model.deployments))
        ]
        self.registry: Registry | None = None
        self.runner: AttemptRunner | None = None
        self._embedder: Embedder | None = None
        self._embedder_loading = asyncio.Lock()
        self.cache: ResponseCache | None = None
        self.flow: RequestFlow | None = None
        self.rag: Any = None  # the files and vector stores service, made on first use
        self.jobs: Any = None  # the jobs service (and its in-process worker)
        self.dashboard: Any = None  # the live dashboard's sampler, made on first use
        self._probe_task: asyncio.Task[None] | None = None
        self._sweeper: RetentionSweeper | None = None  # purges expired data (data_at_rest)

    def _create(self, model: ModelConfig, index: int, name: str | None) -> Backend:
        deployment = model.deployments[index]
        label = deployment.name or f"{name or deployment.backend}-{index}"
        return self._factory(deployment, model_name=name, name=label)

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def is_ready(self) -> bool:
        return self.registry is not None and all(b.is_ready for b in self.backends())

    async def storage_unreachable(self) -> str | None:
        """Why the shared storage cannot be reached now (a PING at most once a second), or
        None: /ready answers 503 while it is not."""
        if self.gate is None or not self.config.admission.ready_requires_storage:
            return None
        return await self.gate.storage_health.unreachable_reason()

    def backends(self) -> list[Backend]:
        if self.registry is None:
            return [backend for _, _, backend in self._planned]
        return [d.backend for m in self.registry.models.values() for d in m.deployments]

    async def start(self) -> None:
        """Open the storage, start every backend (model loads happen here; this can take a
        while), discover the models of wildcard upstreams, then start admission, routing and the
        health probes."""
        if self.storage is None:
            self.storage = await open_storage(
                self.config.storage, data_at_rest=self.config.data_at_rest
            )
            self._owns_storage = True
        await asyncio.gather(*(backend.start() for _, _, backend in self._planned))
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
        await self._load_classifiers(registry)
        self.gate = Gatekeeper(self.config, self.storage, self.metrics, now=self._now)
        await self.gate.start(
            {name: self._capacity(configs[name], states) for name, states in models.items()}
        )
        self.runner = AttemptRunner(
            registry, self.config.retry, self.config.hedge, now=self._now, rng=self._rng,
            tracer=self.tracer,
        )  # fmt: skip
        await self._start_cache()
        self.flow = RequestFlow(
            self.gate,
            self.runner,
            CacheStep(self.cache, self.config, self.metrics, self.gate.storage_health),  # type: ignore[arg-type]
            route=self._route,
            model_named=self._model,
            now=self._now,
            retry_after_s=self.config.admission.default_deadline_s / 4,
            observer=RequestObserver(self.config, self.metrics, self.tracer),
            guard=self.guard,
        )
        # Everything loaded so far (modules, weights' metadata, the cache index) lives as long
        # as the process: the collector's full passes need not walk it (they showed as 10 ms
        # stalls in cache lookups at 100,000 entries).
        gc.collect()
        gc.freeze()
        self.registry = registry  # last: a registry means ready to route
        if self.config.probes.enabled:
            self._probe_task = asyncio.create_task(run_probes(registry, self.config.probes))
        if self.storage.jobs is not None:
            # The jobs service is built on the pipeline: imported here, not at the top.
            from titan.service.jobs import JobsService

            jobs = JobsService.of(self)
            if self.config.jobs.workers:
                jobs.start_worker()
            else:
                jobs.start_upkeep()
        self._sweeper = RetentionSweeper(
            self.storage, lambda: None if self.rag is None else self.rag.stores(),
            interval_s=self.config.data_at_rest.sweep_interval_s, now=time.time,
        )  # fmt: skip
        self._sweeper.start()

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
        return self._embedder

    async def _start_cache(self) -> None:
        """The response cache on the storage's cache store; the embedding model only when some
        model caches semantically."""
        configs = [m.cache or self.config.cache for m in self.config.models]
        is_semantic = any(c.semantic.enabled for c in [*configs, self.config.cache])
        embedder = await self._embedder_loaded() if is_semantic else None
        store = self.storage.cache or MemoryCache()  # type: ignore[union-attr]
        self.cache = ResponseCache(store, embedder=embedder)
        await self.cache.start()

    async def _load_classifiers(self, registry: Registry) -> None:
        """Embed the examples of similarity tier rules, if any (loads the embedding model)."""
        models = [m for m in registry.models.values() if m.classifies_by_similarity]
        if not models:
            return
        await self._embedder_loaded()
        for model in models:
            model.tier_examples = [
                await asyncio.to_thread(self._embedder.encode, list(rule.similar_to))
                if rule.similar_to
                else []
                for rule in model.tiers
            ]

    @staticmethod
    def _capacity(model: ModelConfig, states: list[DeploymentState]) -> int | None:
        """Requests the model runs at once before admission queues: its max_concurrency, else
        the sum of its deployments' (when each has one), else no cap."""
        if model.max_concurrency is not None:
            return model.max_concurrency
        caps = [d.max_concurrency for d in states]
        return None if None in caps else sum(caps)  # type: ignore[arg-type]

    def _state(self, model: ModelConfig, index: int, backend: Backend) -> DeploymentState:
        deployment = model.deployments[index]
        return DeploymentState.create(
            backend.name,
            backend,
            weight=deployment.weight,
            max_concurrency=deployment.max_concurrency,
            timeouts=deployment.timeouts,
            breaker=self.config.breaker,
            now=self._now,
            pool=deployment.pool,
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
        if self.dashboard is not None:
            await self.dashboard.stop()
        if self.jobs is not None:  # first: running jobs go back to the queue while it is open
            await self.jobs.stop()
        if self._sweeper is not None:
            await self._sweeper.stop()
        if self._probe_task is not None:
            self._probe_task.cancel()
            await asyncio.gather(self._probe_task, return_exceptions=True)
        for backend in self.backends():
            try:
                await backend.shutdown()
            except Exception:
                logger.exception("backend shutdown failed", extra={"backend": backend.name})
        if self.rag is not None:
            await self.rag.close()
        if self.flow is not None:
            await self.flow.cache.close()
            self.flow.observer.close()  # the last request lines leave
        if self.cache is not None:
            await self.cache.close()
        if self.gate is not None:
            await self.gate.close()
        if self.storage is not None and self._owns_storage:
            await self.storage.close()
        self.tracer.shutdown()  # the last spans leave

    # ---- models --------------------------------------------------------------------------

    def model_ids(self) -> list[str]:
        return list(self.registry.models) if self.registry is not None else []

    def list_models(self) -> ModelList:
        return ModelList(data=[self.get_model(name) for name in self.model_ids()])

    def get_model(self, model_id: str) -> ModelCard:
        model = self._model(model_id)
        return model.deployments[0].backend.model_card(model.name)

    def prompt_token_counter(self, model_id: str) -> Callable[[list[dict[str, Any]]], int]:
        """Counts a conversation's prompt tokens for ``model_id``: exactly (its chat template
        and tokenizer) when an embedded engine serves it, else about 4 characters a token plus
        a few per message."""
        model = self._model(model_id)
        backend = model.deployments[0].backend
        exact = getattr(backend, "count_prompt_tokens", None)
        if exact is not None:
            return exact  # type: ignore[no-any-return]
        return _approximate_prompt_tokens

    def stats(self) -> dict[str, Any]:
        if self.registry is None:
            return {}
        gate = self.gate
        return {
            name: {
                "requests": model.num_requests,
                "served_as_fallback": model.num_fallbacks,
                "hedges": model.hedge_budget.num_hedges,
                "admission": gate.snapshot(name) if gate is not None else {},
                "deployments": {
                    d.name: {
                        **d.snapshot(),
                        "backend": d.backend.stats() if d.backend.is_ready else {},
                    }
                    for d in model.deployments
                },
            }
            for name, model in self.registry.models.items()
        }

    def _model(self, name: str | None) -> RoutedModel:
        if self.registry is None:
            raise ServiceUnavailableError("The models are still loading; retry shortly.")
        if name is None:  # no model named: the first configured one, as vLLM does
            return next(iter(self.registry.models.values()))
        model = self.registry.models.get(name)
        if model is None:
            raise ModelNotFoundError(name, self.model_ids())
        return model

    # ---- requests ------------------------------------------------------------------------

    async def _route(self, request: ClientRequest) -> tuple[RoutedModel, Any, float | None]:
        asked = self._model(request.model)
        traits = request_traits(request, asked.routing.prefix_chars)
        if asked.classifies_by_similarity and self._embedder is not None:
            embedding = await self._embedder.embed(traits.last_user_text)
            traits = dataclasses.replace(traits, embedding=embedding)
        model = self.registry.resolve(asked.name, traits) or asked  # type: ignore[union-attr]
        model.num_requests += 1
        return model, traits, self._deadline(request)

    def _deadline(self, request: ClientRequest) -> float | None:
        header = request.headers.get("x-titan-timeout")
        if header is None:
            default = self.config.server.request_timeout_s
            return None if default is None else self._now() + default
        try:
            seconds = float(header)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise InvalidRequestError(
                f"Invalid x-titan-timeout header {header!r}: give the request's total deadline "
                "in seconds, e.g. 'x-titan-timeout: 30'."
            )
        return self._now() + seconds

    async def complete(self, request: ClientRequest) -> Routed[Answer]:
        return await self._flow().complete(request)

    async def stream(self, request: ClientRequest) -> Routed[AsyncIterator[Answer]]:
        """A started stream: refusals (and retries) happen before the first chunk is handed out."""
        return await self._flow().stream(request)

    def _flow(self) -> RequestFlow:
        if self.flow is None:
            raise ServiceUnavailableError("The models are still loading; retry shortly.")
        return self.flow


def _approximate_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(4 + len(str(m.get("content") or "")) // 4 for m in messages)


def build_pipeline(config: TitanConfig) -> Pipeline:
    return Pipeline(config)
