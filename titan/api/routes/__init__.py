"""HTTP routes: parse → call the service → serialize."""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from titan.api.routes import admin, chat, completions, health, models


def all_routes() -> list[BaseRoute]:
    return [
        Route("/health", health.health, methods=["GET"]),
        Route("/ready", health.ready, methods=["GET"]),
        Route("/stats", health.stats, methods=["GET"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        # Model ids may contain slashes ("HuggingFaceTB/SmolLM2-135M-Instruct").
        Route("/v1/models/{model:path}", models.retrieve_model, methods=["GET"]),
        Route("/v1/chat/completions", chat.create_chat_completion, methods=["POST"]),
        Route("/v1/completions", completions.create_completion, methods=["POST"]),
        Route("/v1/usage", admin.own_usage, methods=["GET"]),
        Route("/metrics", admin.metrics, methods=["GET"]),
        Route("/admin/keys", admin.list_keys, methods=["GET"]),
        Route("/admin/keys", admin.create_key, methods=["POST"]),
        Route("/admin/keys/{key_id}", admin.revoke_key, methods=["DELETE"]),
        Route("/admin/usage", admin.all_usage, methods=["GET"]),
        Route("/admin/cache", admin.cache_stats, methods=["GET"]),
        Route("/admin/cache", admin.flush_cache, methods=["DELETE"]),
    ]
