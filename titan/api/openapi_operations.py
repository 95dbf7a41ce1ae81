"""What each of Titan's HTTP operations takes and answers, for the OpenAPI document
(titan.api.openapi assembles it). Keyed by (method, route path) exactly as
``titan.api.routes.all_routes()`` declares them: a route missing here is flagged in the document
(``x-titan-undocumented``) and fails tests/api/test_openapi_document.py.

Request bodies come from the pydantic models that parse them where those exist (chat,
completions, responses, admin keys); the bodies that route code checks by hand are described
by JSON Schema in titan.api.openapi_bodies, with the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from titan.api.openapi_bodies import (
    ANY_OBJECT,
    BATCH_BODY,
    JOB_BODY,
    KEY_NAME,
    PAGE,
    RESPONSES_INPUT,
    RESPONSES_TOOL_CHOICE,
    SEARCH_BODY,
    STORE_BODY,
    STORE_FILE_BODY,
    UPLOAD_BODY,
)
from titan.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from titan.service.admin import CreateKeyBody
from titan.service.response_body import INCLUDABLE, ResponsesBody

# A JSON Schema, or a pydantic model whose validation schema is used.
Schema = dict[str, Any] | type[BaseModel]


@dataclass(frozen=True)
class Param:
    """A query or header parameter (path parameters come from the route itself)."""

    name: str
    schema: dict[str, Any]
    location: str = "query"
    description: str = ""


@dataclass(frozen=True)
class Operation:
    summary: str
    tag: str
    body: Schema | None = None
    # Property schemas that replace the model's where its field is checked by hand (typed Any,
    # or a validator pydantic cannot describe).
    body_properties: dict[str, Any] = field(default_factory=dict)
    # Models a hand-written schema points at with "$ref": they are put in the components too.
    refers_to: tuple[type[BaseModel], ...] = ()
    # "application/json", or "multipart/form-data" for uploads.
    body_media_type: str = "application/json"
    is_body_required: bool = True
    params: tuple[Param, ...] = ()
    status_code: int = 200
    answer: Schema = field(default_factory=lambda: ANY_OBJECT)
    answer_media_type: str = "application/json"
    # Failures answered with another body than OpenAI's error (status, JSON Schema).
    other_answers: tuple[tuple[int, dict[str, Any]], ...] = ()
    # Open to anyone (probes, Prometheus, the dashboard): no bearer key asked.
    is_public: bool = False


def _paging(*extra: Param) -> tuple[Param, ...]:
    return (
        Param("limit", {"type": "integer", "minimum": 1, "maximum": 100}, description="Page size."),
        Param("order", {"enum": ["asc", "desc"]}),
        Param("after", {"type": "string"}, description="The last id of the previous page."),
        *extra,
    )


_PERIOD = (
    Param("granularity", {"enum": ["hour", "day", "month", "total"]}),
    Param("start", {"type": "string"}, description="Unix seconds or ISO 8601."),
    Param("end", {"type": "string"}, description="Unix seconds or ISO 8601."),
)
_IF_MATCH = Param(
    "if-match", {"type": "string"}, "header", "The ETag last read (optimistic concurrency)."
)
# Headers that steer a completion (titan.api.parsing.ROUTING_HEADERS).
_STEERING = (
    Param("x-titan-session", {"type": "string"}, "header", "Session affinity routing."),
    Param("x-titan-timeout", {"type": "number", "exclusiveMinimum": 0}, "header",
          "Total deadline in seconds."),
    Param("x-titan-deadline", {"type": "number", "exclusiveMinimum": 0}, "header",
          "Admission deadline in seconds."),
    Param("x-titan-priority", {"enum": ["interactive", "normal", "batch"]}, "header"),
    Param("x-titan-cache", {"enum": ["no-cache", "no-store", "only-if-cached",
                                     "no-cache, no-store"]}, "header"),
    Param("x-titan-timings", {"enum": ["1"]}, "header", "Per-step timings in the answer."),
    Param("x-request-id", {"type": "string", "maxLength": 128}, "header"),
)  # fmt: skip
_INCLUDE_LIST = {"type": "array", "items": {"enum": list(INCLUDABLE)}}
_INCLUDE = Param(
    "include", _INCLUDE_LIST, description="Extra output (file_search_call.results honoured)."
)
_TTL = Param("ttl_s", {"type": "number", "exclusiveMinimum": 0}, description="Expiry in seconds.")
_JOB_STATES = ["queued", "running", "succeeded", "failed", "dead_letter", "cancelled", "expired"]
_STATUS = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}
_TEXT = "text/plain"

OPERATIONS: dict[tuple[str, str], Operation] = {
    # ---- probes and metrics ------------------------------------------------------------------
    ("GET", "/health"): Operation(
        "The process is alive.", "health", answer=_STATUS, is_public=True
    ),
    ("GET", "/ready"): Operation(
        "The models are loaded and the storage reachable (503 until then).",
        "health",
        answer=_STATUS,
        other_answers=((503, _STATUS),),  # a probe's body, e.g. {"status": "loading"}
        is_public=True,
    ),
    ("GET", "/stats"): Operation("Each model's engine counters.", "health", is_public=True),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics.",
        "health",
        answer={"type": "string"},
        answer_media_type=_TEXT,
        is_public=True,
    ),
    ("GET", "/openapi.json"): Operation("This document.", "health", is_public=True),
    # ---- models and inference ----------------------------------------------------------------
    ("GET", "/v1/models"): Operation("List the models.", "models", answer=ModelList),
    ("GET", "/v1/models/{model:path}"): Operation("One model.", "models", answer=ModelCard),
    ("POST", "/v1/chat/completions"): Operation(
        "A chat completion (an SSE stream when 'stream' is true).",
        "inference",
        body=ChatCompletionRequest,
        params=_STEERING,
        answer=ChatCompletion,
    ),
    ("POST", "/v1/completions"): Operation(
        "A text completion (an SSE stream when 'stream' is true).",
        "inference",
        body=CompletionRequest,
        params=_STEERING,
        answer=Completion,
    ),
    ("POST", "/v1/responses"): Operation(
        "A response, continuing 'previous_response_id' when given.",
        "responses",
        body=ResponsesBody,
        params=_STEERING,
        body_properties={
            "input": RESPONSES_INPUT,
            "tool_choice": RESPONSES_TOOL_CHOICE,
            "include": _INCLUDE_LIST,
        },
    ),
    ("GET", "/v1/responses/{response_id}"): Operation(
        "A stored response.", "responses", params=(_INCLUDE,)
    ),
    ("DELETE", "/v1/responses/{response_id}"): Operation("Delete a response.", "responses"),
    ("GET", "/v1/responses/{response_id}/input_items"): Operation(
        "The items a stored response answered (its conversation before its output).",
        "responses",
        params=(*_paging(), _INCLUDE),
        answer=PAGE,
    ),
    # ---- agent state -------------------------------------------------------------------------
    ("GET", "/v1/agents/{agent_id}/state"): Operation("An agent's state document.", "agents"),
    ("PUT", "/v1/agents/{agent_id}/state"): Operation(
        "Replace an agent's state.", "agents", body=ANY_OBJECT, params=(_IF_MATCH, _TTL)
    ),
    ("PATCH", "/v1/agents/{agent_id}/state"): Operation(
        "Merge-patch an agent's state (RFC 7396).",
        "agents",
        body=ANY_OBJECT,
        params=(_IF_MATCH, _TTL),
    ),
    ("DELETE", "/v1/agents/{agent_id}/state"): Operation(
        "Delete an agent's state.", "agents", params=(_IF_MATCH,), status_code=204, answer={}
    ),
    # ---- files -------------------------------------------------------------------------------
    ("POST", "/v1/files"): Operation(
        "Upload a text file.", "files", body=UPLOAD_BODY, body_media_type="multipart/form-data"
    ),
    ("GET", "/v1/files"): Operation(
        "List files.", "files", params=_paging(Param("purpose", {"type": "string"})), answer=PAGE
    ),
    ("GET", "/v1/files/{file_id}"): Operation("A file's metadata.", "files"),
    ("DELETE", "/v1/files/{file_id}"): Operation("Delete a file.", "files"),
    ("GET", "/v1/files/{file_id}/content"): Operation(
        "A file's content.", "files", answer={"type": "string"}, answer_media_type=_TEXT
    ),
    # ---- vector stores -----------------------------------------------------------------------
    ("POST", "/v1/vector_stores"): Operation(
        "Create a vector store.", "vector_stores", body=STORE_BODY
    ),
    ("GET", "/v1/vector_stores"): Operation(
        "List vector stores.", "vector_stores", params=_paging(), answer=PAGE
    ),
    ("GET", "/v1/vector_stores/{vector_store_id}"): Operation("A vector store.", "vector_stores"),
    ("DELETE", "/v1/vector_stores/{vector_store_id}"): Operation(
        "Delete a vector store.", "vector_stores"
    ),
    ("POST", "/v1/vector_stores/{vector_store_id}/files"): Operation(
        "Add a file to a vector store.", "vector_stores", body=STORE_FILE_BODY
    ),
    ("GET", "/v1/vector_stores/{vector_store_id}/files"): Operation(
        "List a vector store's files.",
        "vector_stores",
        params=_paging(
            Param("filter", {"enum": ["in_progress", "completed", "failed", "cancelled"]})
        ),
        answer=PAGE,
    ),
    ("GET", "/v1/vector_stores/{vector_store_id}/files/{file_id}"): Operation(
        "A vector store's file.", "vector_stores"
    ),
    ("DELETE", "/v1/vector_stores/{vector_store_id}/files/{file_id}"): Operation(
        "Remove a file from a vector store.", "vector_stores"
    ),
    ("POST", "/v1/vector_stores/{vector_store_id}/search"): Operation(
        "Search a vector store.", "vector_stores", body=SEARCH_BODY, answer=PAGE
    ),
    # ---- jobs and batches --------------------------------------------------------------------
    ("POST", "/v1/jobs"): Operation(
        "Submit an async job (a completion body).",
        "jobs",
        body=JOB_BODY,
        refers_to=(ChatCompletionRequest, CompletionRequest),
        status_code=202,
    ),
    ("GET", "/v1/jobs"): Operation(
        "List jobs.",
        "jobs",
        params=_paging(
            Param("status", {"enum": _JOB_STATES}), Param("batch_id", {"type": "string"})
        ),
        answer=PAGE,
    ),
    ("GET", "/v1/jobs/{job_id}"): Operation("A job and its result.", "jobs"),
    ("DELETE", "/v1/jobs/{job_id}"): Operation("Cancel a job.", "jobs"),
    ("POST", "/v1/batches"): Operation(
        "Create a batch from an uploaded JSONL file.", "batches", body=BATCH_BODY
    ),
    ("GET", "/v1/batches"): Operation("List batches.", "batches", params=_paging(), answer=PAGE),
    ("GET", "/v1/batches/{batch_id}"): Operation("A batch.", "batches"),
    ("POST", "/v1/batches/{batch_id}/cancel"): Operation(
        "Cancel a batch.", "batches", is_body_required=False
    ),
    # ---- usage, admin, dashboard -------------------------------------------------------------
    ("GET", "/v1/usage"): Operation("The calling key's usage.", "usage", params=_PERIOD),
    ("GET", "/admin/keys"): Operation(
        "List API keys (master key).",
        "admin",
        params=(Param("tenant", {"type": "string"}),),
        answer=PAGE,
    ),
    ("POST", "/admin/keys"): Operation(
        "Create an API key (master key); the secret is shown once.",
        "admin",
        body=CreateKeyBody,
        body_properties={"tenant": KEY_NAME, "name": {"anyOf": [{"const": ""}, KEY_NAME]}},
        status_code=201,
    ),
    ("DELETE", "/admin/keys/{key_id}"): Operation("Revoke an API key (master key).", "admin"),
    ("GET", "/admin/usage"): Operation(
        "Usage of every key (master key).",
        "admin",
        params=(*_PERIOD, Param("scope", {"type": "string"})),
    ),
    ("GET", "/admin/cache"): Operation("Response cache statistics (master key).", "admin"),
    ("DELETE", "/admin/cache"): Operation(
        "Flush the response cache (master key).",
        "admin",
        params=(Param("tenant", {"type": "string"}), Param("model", {"type": "string"})),
    ),
    ("GET", "/dashboard"): Operation(
        "The live dashboard page.",
        "dashboard",
        answer={"type": "string"},
        answer_media_type="text/html",
        is_public=True,
    ),
    ("GET", "/dashboard/data"): Operation(
        "The dashboard's samples.",
        "dashboard",
        params=(Param("since", {"type": "number"}, description="Unix seconds."),),
        is_public=True,
    ),
    ("GET", "/dashboard/static/{name}"): Operation(
        "The dashboard's script, style and chart library.",
        "dashboard",
        answer={"type": "string"},
        answer_media_type="text/javascript",
        is_public=True,
    ),
}
