"""Titan's OpenAPI 3.1 document, built from the app's own routes (so it cannot list a route that
does not exist) and the operation table in titan.api.openapi_operations.

3.1 because its schemas are JSON Schema 2020-12, which is what pydantic v2 writes: the request
models go in unchanged (``$defs`` hoisted into ``components.schemas``), with no 3.0 ``nullable``
rewriting. Built on the first GET /openapi.json and kept on the app (see routes/openapi.py).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from starlette.routing import BaseRoute, Route

from titan.api.openapi_operations import OPERATIONS, Operation, Schema

OPENAPI_VERSION = "3.1.0"
SCHEMA_REF = "#/components/schemas/{model}"
ERROR_REF = {"$ref": "#/components/responses/Error"}
# Starlette's "{model:path}" → OpenAPI's "{model}".
_CONVERTOR = re.compile(r"{([^}:]+)(?::[^}]+)?}")
_PATH_PARAM_TYPES: dict[str, dict[str, Any]] = {
    "IntegerConvertor": {"type": "integer", "minimum": 0},
    "FloatConvertor": {"type": "number", "minimum": 0},
    "UUIDConvertor": {"type": "string", "format": "uuid"},
}
# str and path: an empty segment would be another route.
_STRING_PARAM: dict[str, Any] = {"type": "string", "minLength": 1}

ERROR_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "OpenAI's error body: every 4xx and 5xx answer has this shape.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def openapi_path(route_path: str) -> str:
    return _CONVERTOR.sub(r"{\1}", route_path)


def _operation_id(method: str, route: Route) -> str:
    """``get_v1_models_model``: unique, as code generators want it."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", openapi_path(route.path)).strip("_")
    return f"{method.lower()}_{words}"


class _Components:
    """components.schemas, filled as operations name pydantic models."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {"ErrorResponse": ERROR_RESPONSE_SCHEMA}

    def schema_of(self, schema: Schema, properties: dict[str, Any] | None = None) -> dict[str, Any]:
        if isinstance(schema, dict):
            return schema
        reference = self._hoist(schema)
        if properties:
            self.schemas[schema.__name__]["properties"].update(properties)
        return reference

    def _hoist(self, model: type[BaseModel]) -> dict[str, Any]:
        name = model.__name__
        if name not in self.schemas:
            generated = model.model_json_schema(ref_template=SCHEMA_REF)
            # Nested models come back under $defs: they become components of their own.
            self.schemas.update(generated.pop("$defs", {}))
            self.schemas[name] = generated
        return {"$ref": SCHEMA_REF.format(model=name)}


def _parameters(route: Route, operation: Operation) -> list[dict[str, Any]]:
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": _PATH_PARAM_TYPES.get(type(convertor).__name__, _STRING_PARAM),
        }
        for name, convertor in route.param_convertors.items()
    ]
    for param in operation.params:
        entry = {"name": param.name, "in": param.location, "required": False}
        entry["schema"] = param.schema
        if param.description:
            entry["description"] = param.description
        parameters.append(entry)
    return parameters


def _operation(
    route: Route, method: str, operation: Operation, components: _Components
) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": operation.summary}
    if operation.answer:
        answer["content"] = {
            operation.answer_media_type: {"schema": components.schema_of(operation.answer)}
        }
    document: dict[str, Any] = {
        "operationId": _operation_id(method, route),
        "summary": operation.summary,
        "tags": [operation.tag],
        "parameters": _parameters(route, operation),
        "responses": {str(operation.status_code): answer, "4XX": ERROR_REF, "5XX": ERROR_REF},
    }
    for status_code, schema in operation.other_answers:
        document["responses"][str(status_code)] = {
            "description": f"{status_code}, with its own body.",
            "content": {"application/json": {"schema": schema}},
        }
    for model in operation.refers_to:
        components.schema_of(model)
    if operation.body is not None:
        document["requestBody"] = {
            "required": operation.is_body_required,
            "content": {
                operation.body_media_type: {
                    "schema": components.schema_of(operation.body, operation.body_properties)
                }
            },
        }
    if operation.is_public:
        document["security"] = []  # overrides the document-wide bearer requirement
    return document


def _undocumented(route: Route, method: str) -> dict[str, Any]:
    """A route the table does not know: listed (clients still see it) and flagged for the
    guard test."""
    return {
        "operationId": _operation_id(method, route),
        "summary": f"{method} {route.path} (not described yet)",
        "parameters": _parameters(route, Operation("", "undocumented")),
        "responses": {"default": ERROR_REF},
        "x-titan-undocumented": True,
    }


def build_openapi_document(
    routes: Iterable[BaseRoute], *, title: str = "Titan", version: str = "0.1.0"
) -> dict[str, Any]:
    """The OpenAPI document of ``routes`` (an app's ``app.routes``)."""
    components = _Components()
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        # Starlette adds HEAD to every GET; it is not a separate operation.
        for method in sorted((route.methods or set()) - {"HEAD"}):
            operation = OPERATIONS.get((method, route.path))
            entry = (
                _undocumented(route, method)
                if operation is None
                else _operation(route, method, operation, components)
            )
            paths.setdefault(openapi_path(route.path), {})[method.lower()] = entry
    document = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": "An OpenAI-compatible LLM gateway and serving system.",
        },
        "paths": paths,
        "components": {
            "schemas": components.schemas,
            "responses": {
                "Error": {
                    "description": "An error, in OpenAI's shape.",
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/ErrorResponse"}
                        }
                    },
                }
            },
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key (or the master key for /admin). Also accepted "
                    "as the 'api-key' or 'x-api-key' header. Needed once auth is on.",
                }
            },
        },
        "security": [{"bearerAuth": []}],
    }
    # A copy: the operation table's schemas are shared constants, and callers may edit theirs.
    return copy.deepcopy(document)
