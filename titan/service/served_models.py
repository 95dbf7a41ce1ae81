"""The models this server serves (the router's registry) as the request path sees them: looked up
by name, listed, and resolved for one request (tier rules, then a canary split)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from titan.cache.embedder import Embedder
from titan.errors import ModelNotFoundError
from titan.protocol import ClientRequest, ModelCard, ModelList
from titan.router.registry import Registry, RequestTraits, RoutedModel
from titan.service.traits import request_traits


class ServedModels:
    def __init__(self, registry: Registry, embedder: Embedder | None = None):
        self.registry = registry
        self._embedder = embedder  # for similarity tier rules (loaded when some model has one)

    def ids(self) -> list[str]:
        return list(self.registry.models)

    def named(self, name: str | None) -> RoutedModel:
        if name is None:  # no model named: the first configured one, as vLLM does
            return next(iter(self.registry.models.values()))
        model = self.registry.models.get(name)
        if model is None:
            raise ModelNotFoundError(name, self.ids())
        return model

    def list(self) -> ModelList:
        return ModelList(data=[self.card(name) for name in self.ids()])

    def card(self, model_id: str) -> ModelCard:
        model = self.named(model_id)
        return model.deployments[0].backend.model_card(model.name)

    def conversation_window(self, model_id: str) -> int | None:
        """Most tokens of a server-side conversation's prompt for ``model_id`` by default: what
        an embedded engine chooses for its device, else the model's window (None: unknown)."""
        model = self.named(model_id)
        backend = model.deployments[0].backend
        chosen = getattr(backend, "conversation_window", None)
        if chosen is not None:
            return chosen()  # type: ignore[no-any-return]
        return backend.model_card(model.name).max_model_len

    def prompt_token_counter(self, model_id: str) -> Callable[[list[dict[str, Any]]], int]:
        """Counts a conversation's prompt tokens for ``model_id``: exactly (its chat template
        and tokenizer) when an embedded engine serves it, else about 4 characters a token plus
        a few per message."""
        backend = self.named(model_id).deployments[0].backend
        exact = getattr(backend, "count_prompt_tokens", None)
        if exact is not None:
            return exact  # type: ignore[no-any-return]
        return _approximate_prompt_tokens

    async def resolve(self, request: ClientRequest) -> tuple[RoutedModel, RequestTraits]:
        """The model that serves ``request`` (the one asked for, or the tier or split it
        resolves to) and the request's traits for routing; counts the request on the model."""
        asked = self.named(request.model)
        traits = request_traits(request, asked.routing.prefix_chars)
        if asked.classifies_by_similarity and self._embedder is not None:
            embedding = await self._embedder.embed(traits.last_user_text)
            traits = dataclasses.replace(traits, embedding=embedding)
        model = self.registry.resolve(asked.name, traits) or asked
        model.num_requests += 1
        return model, traits


def _approximate_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(4 + len(str(m.get("content") or "")) // 4 for m in messages)
