"""HTTP routes: parse → call the service → serialize."""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from titan.api.routes import (
    admin,
    agents,
    chat,
    completions,
    dashboard,
    files,
    health,
    jobs,
    models,
    openapi,
    responses,
    vector_stores,
)


def all_routes() -> list[BaseRoute]:
    return [
        Route("/health", health.health, methods=["GET"]),
        Route("/ready", health.ready, methods=["GET"]),
        Route("/stats", health.stats, methods=["GET"]),
        Route("/openapi.json", openapi.openapi_document, methods=["GET"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        # Model ids may contain slashes ("HuggingFaceTB/SmolLM2-135M-Instruct").
        Route("/v1/models/{model:path}", models.retrieve_model, methods=["GET"]),
        Route("/v1/chat/completions", chat.create_chat_completion, methods=["POST"]),
        Route("/v1/completions", completions.create_completion, methods=["POST"]),
        Route("/v1/responses", responses.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.retrieve_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete_response, methods=["DELETE"]),
        Route(
            "/v1/responses/{response_id}/input_items",
            responses.list_input_items,
            methods=["GET"],
        ),
        Route("/v1/agents/{agent_id}/state", agents.get_state, methods=["GET"]),
        Route("/v1/agents/{agent_id}/state", agents.put_state, methods=["PUT"]),
        Route("/v1/agents/{agent_id}/state", agents.patch_state, methods=["PATCH"]),
        Route("/v1/agents/{agent_id}/state", agents.delete_state, methods=["DELETE"]),
        Route("/v1/files", files.create_file, methods=["POST"]),
        Route("/v1/files", files.list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", files.retrieve_file, methods=["GET"]),
        Route("/v1/files/{file_id}", files.delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", files.file_content, methods=["GET"]),
        Route("/v1/vector_stores", vector_stores.create_store, methods=["POST"]),
        Route("/v1/vector_stores", vector_stores.list_stores, methods=["GET"]),
        Route("/v1/vector_stores/{vector_store_id}", vector_stores.retrieve_store, methods=["GET"]),
        Route(
            "/v1/vector_stores/{vector_store_id}", vector_stores.delete_store, methods=["DELETE"]
        ),
        Route(
            "/v1/vector_stores/{vector_store_id}/files", vector_stores.add_file, methods=["POST"]
        ),
        Route(
            "/v1/vector_stores/{vector_store_id}/files", vector_stores.list_files, methods=["GET"]
        ),
        Route(
            "/v1/vector_stores/{vector_store_id}/files/{file_id}",
            vector_stores.retrieve_file,
            methods=["GET"],
        ),
        Route(
            "/v1/vector_stores/{vector_store_id}/files/{file_id}",
            vector_stores.remove_file,
            methods=["DELETE"],
        ),
        Route("/v1/vector_stores/{vector_store_id}/search", vector_stores.search, methods=["POST"]),
        Route("/v1/jobs", jobs.submit_job, methods=["POST"]),
        Route("/v1/jobs", jobs.list_jobs, methods=["GET"]),
        Route("/v1/jobs/{job_id}", jobs.get_job, methods=["GET"]),
        Route("/v1/jobs/{job_id}", jobs.cancel_job, methods=["DELETE"]),
        Route("/v1/batches", jobs.create_batch, methods=["POST"]),
        Route("/v1/batches", jobs.list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", jobs.get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", jobs.cancel_batch, methods=["POST"]),
        Route("/v1/usage", admin.own_usage, methods=["GET"]),
        Route("/metrics", admin.metrics, methods=["GET"]),
        Route("/dashboard", dashboard.page, methods=["GET"]),
        Route("/dashboard/data", dashboard.data, methods=["GET"]),
        Route("/dashboard/static/{name}", dashboard.static, methods=["GET"]),
        Route("/admin/keys", admin.list_keys, methods=["GET"]),
        Route("/admin/keys", admin.create_key, methods=["POST"]),
        Route("/admin/keys/{key_id}", admin.revoke_key, methods=["DELETE"]),
        Route("/admin/usage", admin.all_usage, methods=["GET"]),
        Route("/admin/cache", admin.cache_stats, methods=["GET"]),
        Route("/admin/cache", admin.flush_cache, methods=["DELETE"]),
    ]
