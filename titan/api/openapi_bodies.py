"""The JSON Schemas of the request bodies that route code checks by hand (no pydantic model
parses them), for the OpenAPI document. Each states the rules of the code that reads the body:
titan/api/routes/*.py and the services they call."""

from __future__ import annotations

from typing import Any

ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
STRING_LIST: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
PAGE: dict[str, Any] = {
    "type": "object",
    "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
    "required": ["object", "data"],
}

CHUNKING_STRATEGY: dict[str, Any] = {
    "anyOf": [
        {"type": "object", "properties": {"type": {"const": "auto"}}, "required": ["type"]},
        {
            "type": "object",
            "properties": {
                "type": {"const": "static"},
                "static": {
                    "type": "object",
                    "properties": {
                        "max_chunk_size_tokens": {"type": "integer", "minimum": 1},
                        "chunk_overlap_tokens": {"type": "integer", "minimum": 0},
                    },
                },
            },
            "required": ["type", "static"],
        },
    ]
}

KEY_NAME = {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}
TEXT_PARTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "type": {"enum": ["input_text", "output_text", "text"]},
            "text": {"type": "string"},
        },
        "required": ["type", "text"],
    },
}
_RESPONSES_MESSAGE = {
    "type": "object",
    "properties": {
        "type": {"const": "message"},
        "id": {"type": "string"},
        "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": {"anyOf": [{"type": "string"}, TEXT_PARTS]},
    },
    "required": ["role", "content"],
}
_FUNCTION_CALL = {
    "type": "object",
    "properties": {
        "type": {"const": "function_call"},
        "id": {"type": "string"},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"},
    },
    "required": ["type", "call_id", "name", "arguments"],
}
_FUNCTION_CALL_OUTPUT = {
    "type": "object",
    "properties": {
        "type": {"const": "function_call_output"},
        "id": {"type": "string"},
        "call_id": {"type": "string"},
        "output": {"anyOf": [{"type": "string"}, TEXT_PARTS]},
    },
    "required": ["type", "call_id", "output"],
}
# Replayed output items that carry nothing for the model: accepted and skipped.
_SKIPPED_ITEM = {
    "type": "object",
    "properties": {"type": {"enum": ["file_search_call", "reasoning"]}},
    "required": ["type"],
}
RESPONSES_INPUT = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [_RESPONSES_MESSAGE, _FUNCTION_CALL, _FUNCTION_CALL_OUTPUT, _SKIPPED_ITEM]
            },
        },
    ]
}
RESPONSES_TOOL_CHOICE = {
    "anyOf": [
        {"enum": ["none", "auto", "required"]},
        {
            "type": "object",
            "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
            "required": ["type", "name"],
        },
        {"type": "object", "properties": {"type": {"const": "file_search"}}, "required": ["type"]},
        {
            "type": "object",
            "properties": {
                "type": {"const": "allowed_tools"},
                "mode": {"enum": ["auto", "required"]},
                "tools": {"type": "array", "items": ANY_OBJECT},
            },
            "required": ["type", "mode", "tools"],
        },
    ]
}
JOB_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "endpoint": {"enum": ["/v1/chat/completions", "/v1/completions"]},
        # The request to run (stream must be false): a chat or completions body.
        "body": {
            "anyOf": [
                {"$ref": "#/components/schemas/ChatCompletionRequest"},
                {"$ref": "#/components/schemas/CompletionRequest"},
            ]
        },
        "priority": {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": 9},
                {"enum": ["low", "normal", "high"]},
            ]
        },
        "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 256},
        # Seconds from now, a Unix time or an ISO 8601 time.
        "deadline": {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "format": "date-time"},
            ]
        },
        "metadata": ANY_OBJECT,
    },
    "required": ["body"],
    "additionalProperties": False,
}
BATCH_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "input_file_id": {"type": "string"},
        "endpoint": {"enum": ["/v1/chat/completions", "/v1/completions"]},
        "completion_window": {"type": "string", "examples": ["24h"]},
        "metadata": ANY_OBJECT,
    },
    "required": ["input_file_id", "endpoint"],
}
UPLOAD_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"enum": ["assistants", "batch", "user_data"]},
    },
    "required": ["file", "purpose"],
}
STORE_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "file_ids": STRING_LIST,
        "metadata": ANY_OBJECT,
        "chunking_strategy": CHUNKING_STRATEGY,
    },
}
STORE_FILE_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {"file_id": {"type": "string"}, "chunking_strategy": CHUNKING_STRATEGY},
    "required": ["file_id"],
}
SEARCH_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"anyOf": [{"type": "string"}, STRING_LIST]},
        "max_num_results": {"type": "integer", "minimum": 1, "maximum": 50},
        "ranking_options": ANY_OBJECT,
    },
    "required": ["query"],
}
