"""GET /openapi.json: an OpenAPI 3.1 document of every route Titan serves (a guard: a new route
without a description fails here), request bodies from the protocol's pydantic models, the
bearer scheme, and the OpenAI error body for 4xx/5xx — which real error answers match."""

from __future__ import annotations

import httpx
import jsonschema
import schemathesis
from schemathesis.specs.openapi.definitions import OPENAPI_31
from starlette.routing import Route

from titan.api.openapi import build_openapi_document, openapi_path
from titan.api.routes import all_routes

PUBLIC_PATHS = {"/health", "/ready", "/stats", "/metrics", "/openapi.json", "/dashboard"}


def _operations(document: dict) -> dict[tuple[str, str], dict]:
    return {
        (method.upper(), path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }


def test_every_route_is_described_in_the_document():
    operations = _operations(build_openapi_document(all_routes()))
    expected = {
        (method, openapi_path(route.path))
        for route in all_routes()
        if isinstance(route, Route)
        for method in route.methods - {"HEAD"}
    }
    assert expected == set(operations)
    undocumented = sorted(key for key, op in operations.items() if op.get("x-titan-undocumented"))
    assert undocumented == [], f"describe these in titan/api/openapi_operations.py: {undocumented}"


def test_a_route_without_a_description_is_flagged():
    async def handler(request):  # pragma: no cover - never called
        raise NotImplementedError

    routes = [*all_routes(), Route("/v1/new_thing/{thing_id}", handler, methods=["POST"])]
    operation = build_openapi_document(routes)["paths"]["/v1/new_thing/{thing_id}"]["post"]
    assert operation["x-titan-undocumented"] is True
    assert operation["parameters"][0]["name"] == "thing_id"


async def test_the_app_serves_the_document_it_is_built_from(client: httpx.AsyncClient):
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == build_openapi_document(all_routes())
    assert (await client.get("/openapi.json")).content == response.content  # cached per app


def test_the_document_is_valid_openapi_that_schemathesis_loads():
    document = build_openapi_document(all_routes())
    assert document["openapi"] == "3.1.0"
    # The OpenAPI Initiative's 3.1 schema, as schemathesis vendors it.
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(_operations(document))
    operation_ids = [operation["operationId"] for operation in _operations(document).values()]
    assert len(set(operation_ids)) == len(operation_ids)


def test_bodies_come_from_the_protocol_models_and_paths_name_their_parameters():
    document = build_openapi_document(all_routes())
    operations = _operations(document)
    schemas = document["components"]["schemas"]
    chat = operations[("POST", "/v1/chat/completions")]["requestBody"]["content"]
    assert chat["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert schemas["ChatCompletionRequest"]["required"] == ["messages"]
    assert "ChatRequestMessage" in schemas  # nested models hoisted out of $defs
    assert all("$defs" not in schema for schema in schemas.values())
    upload = operations[("POST", "/v1/files")]["requestBody"]["content"]
    assert set(upload["multipart/form-data"]["schema"]["required"]) == {"file", "purpose"}
    model = operations[("GET", "/v1/models/{model}")]["parameters"][0]
    assert model == {"name": "model", "in": "path", "required": True,
                     "schema": {"type": "string", "minLength": 1}}  # fmt: skip
    store_file = operations[("GET", "/v1/vector_stores/{vector_store_id}/files/{file_id}")]
    assert [p["name"] for p in store_file["parameters"]] == ["vector_store_id", "file_id"]


def test_bearer_auth_everywhere_but_the_probes_and_the_dashboard():
    document = build_openapi_document(all_routes())
    bearer = document["components"]["securitySchemes"]["bearerAuth"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    assert document["security"] == [{"bearerAuth": []}]
    for (_, path), operation in _operations(document).items():
        is_public = path in PUBLIC_PATHS or path.startswith("/dashboard")
        assert ("security" in operation and operation["security"] == []) == is_public, path


async def test_real_error_answers_match_the_documented_error_body(client: httpx.AsyncClient):
    document = build_openapi_document(all_routes())
    error_schema = document["components"]["schemas"]["ErrorResponse"]
    for operation in _operations(document).values():
        assert operation["responses"]["4XX"] == {"$ref": "#/components/responses/Error"}
        assert operation["responses"]["5XX"] == {"$ref": "#/components/responses/Error"}
    answers = [
        await client.post("/v1/chat/completions", json={"messages": []}),  # 400
        await client.post("/v1/chat/completions", content=b"{"),  # 400, not JSON
        await client.get("/v1/nowhere"),  # 404
        await client.put("/v1/models"),  # 405
        await client.get("/v1/files/file-missing"),  # 404 from the service
    ]
    for answer in answers:
        assert answer.status_code >= 400
        jsonschema.validate(answer.json(), error_schema)
    # ... and the schema is strict enough to refuse what is not one.
    for not_an_error in ({"detail": "Not Found"}, {"error": {"message": "x", "type": "y"}}):
        try:
            jsonschema.validate(not_an_error, error_schema)
        except jsonschema.ValidationError:
            continue
        raise AssertionError(f"ErrorResponse accepted {not_an_error}")
