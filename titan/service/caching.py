"""The response cache inside the pipeline: directives, lookup, replay and storing the answer.

A hit costs no limits and no backend work. Only deterministic requests are stored (unless the
model's cache config says ``cache_sampled``), only whole answers (a stream cut short is not), and
never under ``no-store``. A stream that is to be stored asks its backend for the usage chunk, so
that a replay carries the original usage; the client sees that chunk only if it asked for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from titan.cache.keys import is_deterministic, parse_directives, request_keys
from titan.cache.response_cache import Lookup, ResponseCache
from titan.config import TitanConfig
from titan.config.cache import CacheConfig
from titan.errors import NotCachedError, StorageUnavailableError
from titan.observability.metrics import TitanMetrics
from titan.protocol import Answer, ClientRequest, answer_bytes
from titan.service.attempts import Routed
from titan.service.cache_replay import StreamAssembler, replay_stream, replay_whole
from titan.service.storage_health import StorageHealth
from titan.service.streaming import close_stream

logger = logging.getLogger("titan.cache")

CACHE_HEADER = "x-titan-cache"


@dataclass
class CachePlan:
    config: CacheConfig
    lookup: Lookup  # under no-cache: the keys only, nothing looked up
    tenant: str | None
    model: str
    is_storable: bool
    is_deterministic: bool = True

    @property
    def has_answer_use(self) -> bool:
        """The answer is to be stored, or compared with a cached one (a verification)."""
        return self.is_storable or self.lookup.verification is not None

    @property
    def headers(self) -> dict[str, str]:
        hit = self.lookup.hit
        if hit is None:
            return {CACHE_HEADER: "miss"}
        headers = {CACHE_HEADER: f"hit-{hit.kind}"}
        if hit.similarity is not None:
            headers["x-titan-cache-similarity"] = f"{hit.similarity:.4f}"
        return headers


class CacheStep:
    def __init__(
        self,
        cache: ResponseCache,
        config: TitanConfig,
        metrics: TitanMetrics,
        storage_health: StorageHealth | None = None,
    ):
        self.cache = cache
        self.metrics = metrics
        # The cache fails open: while the store is unreachable, lookups miss and nothing is stored.
        self.storage_health = storage_health or StorageHealth(None, metrics)
        self._storing: set[asyncio.Task[None]] = set()
        self._configs = {
            m.name: m.cache if m.cache is not None else config.cache
            for m in config.models
            if m.name is not None
        }
        self._default = config.cache

    def config_for(self, model: str) -> CacheConfig:
        return self._configs.get(model, self._default)

    async def lookup(
        self, request: ClientRequest, tenant: str | None, model: str
    ) -> CachePlan | None:
        """None when the model caches nothing. Raises NotCachedError for an only-if-cached miss."""
        config = self.config_for(model)
        directives = parse_directives(request.headers.get(CACHE_HEADER), request.body.get("cache"))
        if not (config.exact or config.semantic.enabled):
            if "only-if-cached" in directives:
                raise NotCachedError(f"Model '{model}' caches no answers (only-if-cached).")
            return None
        keys = request_keys(tenant, model, request.endpoint, request.body)
        is_deterministic_request = is_deterministic(request.body)
        is_storable = "no-store" not in directives and (
            config.cache_sampled or is_deterministic_request
        )
        if "no-cache" in directives:
            lookup = Lookup(keys)  # stored afterwards without an embedding: as an exact entry
        else:
            try:
                lookup = await self.cache.lookup(keys, config, model)
            except StorageUnavailableError as exc:
                self.storage_health.failed("cache", exc, action="misses and stores nothing")
                lookup = Lookup(keys)
                is_storable = False
            else:
                self.storage_health.succeeded("cache")
        plan = CachePlan(config, lookup, tenant, model, is_storable, is_deterministic_request)
        hit = lookup.hit
        self.metrics.inc(self.metrics.cache_lookups, model, f"hit-{hit.kind}" if hit else "miss")
        if hit is None and "only-if-cached" in directives:
            raise NotCachedError(
                "No cached answer for this request (only-if-cached). Send it without the "
                "directive to have the model answer it."
            )
        return plan

    def replay(self, plan: CachePlan, request: ClientRequest) -> Routed[object]:
        hit = plan.lookup.hit
        value: object
        if request.is_stream:
            value = replay_stream(hit.value, request.endpoint, request.parsed.include_usage)  # type: ignore[union-attr]
        else:
            value = replay_whole(hit.value, request.endpoint)  # type: ignore[union-attr]
        return Routed(value, plan.model, "cache", 0, plan.headers)

    def store_whole(self, plan: CachePlan, answer: Answer) -> None:
        if plan.has_answer_use:
            self._store(plan, answer_bytes(answer))

    def _store(self, plan: CachePlan, value: bytes) -> None:
        """In the background: the client has its answer; the index insert (~1-3 ms at 100,000
        entries) and the store's round trip are not on its path."""
        task = asyncio.create_task(
            self.cache.store_answer(
                plan.lookup, plan.config, tenant=plan.tenant, model=plan.model, value=value,
                is_deterministic=plan.is_deterministic, is_storable=plan.is_storable,
            )
        )  # fmt: skip
        self._storing.add(task)
        task.add_done_callback(self._stored)

    def _stored(self, task: asyncio.Task[None]) -> None:
        self._storing.discard(task)
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, StorageUnavailableError):
            self.storage_health.failed("cache", exc, action="misses and stores nothing")
        elif exc is not None:
            logger.warning("storing an answer in the cache failed: %s", exc)

    async def close(self) -> None:
        """Let the answers being stored reach the store."""
        await asyncio.gather(*self._storing, return_exceptions=True)

    def recording(
        self, plan: CachePlan, request: ClientRequest, stream: AsyncIterator[Answer]
    ) -> AsyncIterator[Answer]:
        """The stream as the client asked for it, stored once it has ended whole."""
        if not plan.has_answer_use:
            return stream
        return self._record(plan, request, stream)

    async def _record(
        self, plan: CachePlan, request: ClientRequest, stream: AsyncIterator[Answer]
    ) -> AsyncIterator[Answer]:
        assembler = StreamAssembler(request.endpoint)
        wants_usage = request.parsed.include_usage
        try:
            async for chunk in stream:
                assembler.add(chunk)
                if not wants_usage and _is_usage_only(chunk):
                    continue  # asked for the cache's sake, not the client's
                yield chunk
        finally:
            await close_stream(stream)
        whole = assembler.whole()
        if whole is not None and plan.has_answer_use:  # a guardrail may block it midway
            self._store(plan, whole)


def _is_usage_only(chunk: Answer) -> bool:
    data = answer_bytes(chunk)
    return b'"usage"' in data and (b'"choices":[]' in data or b'"choices": []' in data)
