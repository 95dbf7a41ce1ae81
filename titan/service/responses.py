"""The Responses API over the pipeline: a stored conversation continued by
``previous_response_id``, trimmed to the model's window by tokens, run as a chat completion
(auth, cache, admission and routing included), answered as a Response object or its stream of
events, and stored for the next turn."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from pydantic import Field, ValidationError

from titan.config import Settings
from titan.context.conversations import Conversations, input_messages, new_response_id
from titan.context.trimming import Trimmed, trim
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, ClientRequest, answer_bytes
from titan.service.rag import RagService

# Prompt tokens kept free besides max_output_tokens (the template's closing tokens, slack).
RESERVE_TOKENS = 16
# Output budget assumed for trimming when a request gives no max_output_tokens.
DEFAULT_OUTPUT_TOKENS = 256
TRIMMED_HEADER = "x-titan-context-trimmed"
# Chunks given to the model by the file_search tool unless it sets max_num_results.
DEFAULT_SOURCES = 5


class ResponsesBody(Settings):
    model_config = Settings.model_config | {"extra": "ignore"}  # e.g. include, truncation
    model: str | None = None
    input: Any
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    metadata: dict[str, str] = Field(default_factory=dict)
    tools: list[dict[str, Any]] = Field(default_factory=list)


def parse_body(data: Mapping[str, Any]) -> ResponsesBody:
    try:
        return ResponsesBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise InvalidRequestError(f"Invalid '{where}': {first['msg']}.", param=where) from None


class ResponsesService:
    def __init__(self, pipeline: Any):
        self.pipeline = pipeline
        self.conversations = Conversations(pipeline.storage.documents)

    async def _prepare(
        self, body: ResponsesBody, api_key: str | None, client_host: str | None, headers: dict
    ) -> tuple[str, list[dict], Trimmed, ClientRequest, list[dict]]:
        tenant = await self.pipeline.gate.tenant_for(api_key)
        model = self.pipeline.get_model(body.model or self.pipeline.model_ids()[0])
        history = await self.conversations.history(tenant, body.previous_response_id)
        turn = input_messages(body.input)
        conversation = history + turn
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        sources = await self._file_search(tenant, body.tools, turn[-1]["content"])
        if sources:
            system.append({"role": "system", "content": sources_prompt(sources)})
        count = self.pipeline.prompt_token_counter(model.id)
        output_tokens = body.max_output_tokens or DEFAULT_OUTPUT_TOKENS
        if model.max_model_len:
            budget = model.max_model_len - output_tokens - RESERVE_TOKENS
            trimmed = trim(system + conversation, count, budget)
        else:  # an upstream that does not say its window: nothing to trim against
            trimmed = Trimmed(system + conversation, count(system + conversation), 0, 0)
        chat = {"model": model.id, "messages": trimmed.messages, "stream": body.stream}
        optional = {
            "max_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
        }
        chat |= {k: v for k, v in optional.items() if v is not None}
        if body.stream:
            chat["stream_options"] = {"include_usage": True}
        request = ClientRequest(
            endpoint="chat",
            parsed=ChatCompletionRequest.model_validate(chat),
            body=chat,
            request_id=f"req-{uuid.uuid4().hex}",
            headers=headers,
            api_key=api_key,
            client_host=client_host,
        )
        return tenant, conversation, trimmed, request, sources

    async def _file_search(self, tenant: str, tools: list[dict], query: str) -> list[dict]:
        """The file_search tool: the best chunks of the named vector stores for the newest
        input, which the model is given with numbered source markers."""
        stores: list[str] = []
        limit = DEFAULT_SOURCES
        for index, tool in enumerate(tools):
            if tool.get("type") != "file_search":
                raise InvalidRequestError(
                    f"Unsupported tool {tool.get('type')!r} in 'tools[{index}]': /v1/responses "
                    "supports file_search.",
                    param=f"tools[{index}]",
                )
            ids = tool.get("vector_store_ids")
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                raise InvalidRequestError(
                    f"'tools[{index}].vector_store_ids' must list vector store ids.",
                    param=f"tools[{index}].vector_store_ids",
                )
            stores += ids
            limit = int(tool.get("max_num_results") or limit)
        if not stores:
            return []
        vector_stores = await RagService.of(self.pipeline).stores()
        found = []
        for store_id in stores:
            page = await vector_stores.search(tenant, store_id, query, limit)
            found += page["data"]
        return sorted(found, key=lambda r: r["score"], reverse=True)[:limit]

    async def create(
        self, data: Mapping[str, Any], api_key: str | None, client_host: str | None, headers: dict
    ) -> tuple[dict[str, Any] | AsyncIterator[bytes], dict[str, str]]:
        body = parse_body(data)
        tenant, conversation, trimmed, request, sources = await self._prepare(
            body, api_key, client_host, headers
        )
        response_headers = {
            TRIMMED_HEADER: f"turns={trimmed.num_dropped_turns};"
            f"messages={trimmed.num_dropped_messages}"
        }
        if body.stream:
            routed = await self.pipeline.stream(request)
            response_headers |= routed.headers
            events = self._events(body, tenant, conversation, trimmed, routed.value, sources)
            return events, response_headers
        routed = await self.pipeline.complete(request)
        answer = orjson.loads(answer_bytes(routed.value))
        choice = answer["choices"][0]
        text = choice["message"].get("content") or ""
        response = response_object(
            body,
            routed.model,
            text,
            choice.get("finish_reason"),
            answer.get("usage"),
            trimmed,
            sources=sources,
        )
        if body.store:
            await self.conversations.save(tenant, response, _with_answer(conversation, text))
        return response, response_headers | routed.headers

    async def _events(
        self,
        body: ResponsesBody,
        tenant: str,
        conversation: list[dict],
        trimmed: Trimmed,
        chunks: AsyncIterator[Any],
        sources: list[dict],
    ) -> AsyncIterator[bytes]:
        response = response_object(body, body.model or "", "", None, None, trimmed)
        response["status"], response["output"] = "in_progress", []
        item_id = response_item_id()
        stream = EventWriter()
        yield stream.event("response.created", response=response)
        yield stream.event("response.in_progress", response=response)
        position = 0
        if sources:  # the search already ran: its item comes first, done
            search = file_search_item(sources)
            yield stream.event("response.output_item.added", output_index=0, item=search)
            yield stream.event("response.output_item.done", output_index=0, item=search)
            position = 1
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant",
                "content": []}  # fmt: skip
        yield stream.event("response.output_item.added", output_index=position, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item_id, "output_index": position, "content_index": 0}
        yield stream.event("response.content_part.added", **where, part=part)
        texts, finish, usage, model = [], None, None, body.model or ""
        async for chunk in chunks:
            data = orjson.loads(answer_bytes(chunk))
            model = data.get("model", model)
            usage = data.get("usage") or usage
            for choice in data.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    texts.append(delta)
                    yield stream.event("response.output_text.delta", **where, delta=delta,
                                       logprobs=[])  # fmt: skip
                finish = choice.get("finish_reason") or finish
        text = "".join(texts)
        yield stream.event("response.output_text.done", **where, text=text, logprobs=[])
        annotations = citations(sources, len(text))
        done_part = {**part, "text": text, "annotations": annotations}
        yield stream.event("response.content_part.done", **where, part=done_part)
        ids = {"item_id": item_id, "response_id": response["id"]}
        final = response_object(
            body, model, text, finish, usage, trimmed, **ids, created_at=response["created_at"],
            sources=sources,
        )  # fmt: skip
        message = final["output"][-1]
        yield stream.event("response.output_item.done", output_index=position, item=message)
        done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield stream.event(done, response=final)
        if body.store:
            await self.conversations.save(tenant, final, _with_answer(conversation, text))

    async def get(self, response_id: str, api_key: str | None) -> dict[str, Any]:
        tenant = await self.pipeline.gate.tenant_for(api_key)
        return await self.conversations.get(tenant, response_id)

    async def delete(self, response_id: str, api_key: str | None) -> dict[str, Any]:
        tenant = await self.pipeline.gate.tenant_for(api_key)
        await self.conversations.delete(tenant, response_id)
        return {"id": response_id, "object": "response", "deleted": True}


def sources_prompt(sources: list[dict]) -> str:
    """The retrieved chunks as the model sees them: numbered, with their file."""
    blocks = [
        f"[{n}] {source['filename']} ({source['file_id']}):\n"
        + "".join(part.get("text", "") for part in source["content"])
        for n, source in enumerate(sources, start=1)
    ]
    return (
        "Answer from these sources when they hold the answer, and cite them as [n].\n\n"
        + "\n\n".join(blocks)
    )


def file_search_item(sources: list[dict]) -> dict[str, Any]:
    return {
        "type": "file_search_call",
        "id": f"fs_{uuid.uuid4().hex}",
        "status": "completed",
        "queries": [],
        "results": [
            {
                "file_id": s["file_id"],
                "filename": s["filename"],
                "score": s["score"],
                "text": "".join(part.get("text", "") for part in s["content"]),
                "attributes": {},
            }
            for s in sources
        ],
    }


def citations(sources: list[dict] | None, text_length: int) -> list[dict[str, Any]]:
    """One file citation per source given to the model, at the end of the answer."""
    return [
        {
            "type": "file_citation",
            "file_id": s["file_id"],
            "filename": s["filename"],
            "index": text_length,
        }
        for s in sources or []
    ]


class EventWriter:
    """SSE events of the Responses API: ``event:`` and ``data:`` lines, numbered."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def response_item_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def _with_answer(conversation: list[dict], text: str) -> list[dict]:
    return [*conversation, {"role": "assistant", "content": text}]


def response_object(
    body: ResponsesBody,
    model: str,
    text: str,
    finish_reason: str | None,
    usage: Mapping[str, Any] | None,
    trimmed: Trimmed,
    *,
    item_id: str | None = None,
    response_id: str | None = None,
    created_at: float | None = None,
    sources: list[dict] | None = None,
) -> dict[str, Any]:
    prompt = int((usage or {}).get("prompt_tokens", trimmed.num_prompt_tokens))
    completion = int((usage or {}).get("completion_tokens", 0))
    is_cut = finish_reason == "length"
    message = {
        "type": "message",
        "id": item_id or response_item_id(),
        "status": "incomplete" if is_cut else "completed",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": text, "annotations": citations(sources, len(text))}
        ],
    }
    output = ([file_search_item(sources)] if sources else []) + [message]
    return {
        "id": response_id or new_response_id(),
        "object": "response",
        "created_at": created_at or int(time.time()),
        "status": "incomplete" if is_cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if is_cut else None,
        "error": None,
        "model": model,
        "output": output,
        "instructions": body.instructions,
        "previous_response_id": body.previous_response_id,
        "max_output_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "metadata": body.metadata,
        "store": body.store,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        # Titan's extension: what trimming left out of this turn's prompt.
        "context": {
            "dropped_turns": trimmed.num_dropped_turns,
            "dropped_messages": trimmed.num_dropped_messages,
            "prompt_tokens_counted": trimmed.num_prompt_tokens,
        },
    }
