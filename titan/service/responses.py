"""The Responses API over the pipeline: a stored conversation continued by
``previous_response_id``, trimmed to the model's window by tokens, run as a chat completion
(auth, cache, admission and routing included), answered as a Response object or its stream of
events, and stored for the next turn."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from pydantic import Field, ValidationError

from titan.config import Settings
from titan.context.conversations import Conversations, History, input_messages
from titan.context.trimming import Trimmed, trim, turns
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, ClientRequest, answer_bytes
from titan.service.rag import RagService
from titan.service.response_objects import (
    EventWriter,
    citations,
    file_search_item,
    response_item_id,
    response_object,
    sources_prompt,
)

# Prompt tokens kept free besides max_output_tokens (the template's closing tokens, slack).
RESERVE_TOKENS = 16
# Output budget assumed for trimming when a request gives no max_output_tokens.
DEFAULT_OUTPUT_TOKENS = 256
TRIMMED_HEADER = "x-titan-context-trimmed"
# Chunks given to the model by the file_search tool unless it sets max_num_results.
DEFAULT_SOURCES = 5


@dataclass(frozen=True)
class Prepared:
    """A Responses request made ready: the caller's tenant, the conversation with its new input,
    the trimmed prompt, the chat completion to run and the file_search sources."""

    tenant: str
    history: History
    trimmed: Trimmed
    request: ClientRequest
    sources: list[dict]


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
    ) -> Prepared:
        tenant = await self.pipeline.gate.auth.tenant_for(api_key)
        model = self.pipeline.get_model(body.model or self.pipeline.model_ids()[0])
        earlier = await self.conversations.continued(tenant, body.previous_response_id)
        turn = input_messages(body.input)
        history = earlier.extended(*turn)
        conversation = history.messages
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        sources = await self._file_search(tenant, body.tools, turn[-1]["content"])
        if sources:
            system.append({"role": "system", "content": sources_prompt(sources)})
        count = self.pipeline.prompt_token_counter(model.id)
        output_tokens = body.max_output_tokens or DEFAULT_OUTPUT_TOKENS
        if model.max_model_len:
            context = self.pipeline.config.context
            budget = model.max_model_len - output_tokens - RESERVE_TOKENS
            target = int(budget * (1 - context.trim_headroom))
            trimmed = trim(system + conversation, count, budget,
                           keep_dropped=history.dropped, target=target)  # fmt: skip
            history = replace(history, dropped=trimmed.num_dropped_messages)
            if trimmed.num_dropped_messages and context.summary_model:
                trimmed, history = await self._summarized(
                    context.summary_model, system, history, count, budget, api_key, client_host
                )
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
        request = chat_request(chat, api_key, client_host, headers)
        return Prepared(tenant, history, trimmed, request, sources)

    async def _summarized(
        self,
        summary_model: str,
        system: list[dict],
        history: History,
        count: Any,
        budget: int,
        api_key: str | None,
        client_host: str | None,
    ) -> tuple[Trimmed, History]:
        """The prompt with the dropped messages replaced by the running summary (extended
        when more fell out since the last request)."""
        conversation, summary, summarized = history.messages, history.summary, history.summarized
        if history.dropped > summarized:
            summary = await self._summarize(
                summary_model, summary, conversation[summarized : history.dropped], api_key,
                client_host,
            )  # fmt: skip
            summarized = history.dropped
        note = {"role": "system", "content": f"Earlier in this conversation: {summary}"}
        trimmed = trim([*system, note, *conversation[summarized:]], count, budget)
        trimmed = Trimmed(
            trimmed.messages,
            trimmed.num_prompt_tokens,
            len(turns(conversation[:summarized])[1]) + trimmed.num_dropped_turns,
            summarized + trimmed.num_dropped_messages,
        )
        return trimmed, replace(history, summary=summary, summarized=summarized)

    async def _summarize(
        self,
        model: str,
        summary: str | None,
        messages: list[dict],
        api_key: str | None,
        client_host: str | None,
    ) -> str:
        """The running summary, extended with ``messages``, written by the configured model."""
        transcript = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        earlier = f"Summary so far: {summary}\n\n" if summary else ""
        prompt = (
            f"{earlier}More of the conversation:\n{transcript}\n\nWrite a short summary of "
            "the whole conversation so far: the facts, names and decisions a reader needs."
        )
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.pipeline.config.context.summary_max_tokens,
            "temperature": 0,
        }
        request = chat_request(chat, api_key, client_host, {})
        answer = orjson.loads(answer_bytes((await self.pipeline.complete(request)).value))
        return str(answer["choices"][0]["message"].get("content") or "").strip()

    async def _file_search(self, tenant: str, tools: list[dict], query: str) -> list[dict]:
        """The file_search tool: the best chunks of the named vector stores for the newest
        input, which the model is given with numbered source markers."""
        stores: list[str] = []
        limit, ranking = DEFAULT_SOURCES, None
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
            limit = tool.get("max_num_results") or limit
            ranking = tool.get("ranking_options", ranking)
        if not stores:
            return []
        vector_stores = RagService.of(self.pipeline).stores()
        found = []
        for store_id in stores:
            page = await vector_stores.search(tenant, store_id, query, limit, ranking)
            found += page["data"]
        return sorted(found, key=lambda r: r["score"], reverse=True)[:limit]

    async def create(
        self, data: Mapping[str, Any], api_key: str | None, client_host: str | None, headers: dict
    ) -> tuple[dict[str, Any] | AsyncIterator[bytes], dict[str, str]]:
        body = parse_body(data)
        prepared = await self._prepare(body, api_key, client_host, headers)
        trimmed, sources = prepared.trimmed, prepared.sources
        response_headers = {
            TRIMMED_HEADER: f"turns={trimmed.num_dropped_turns};"
            f"messages={trimmed.num_dropped_messages}"
        }
        if body.stream:
            routed = await self.pipeline.stream(prepared.request)
            response_headers |= routed.headers
            return self._events(body, prepared, routed.value), response_headers
        routed = await self.pipeline.complete(prepared.request)
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
            summarized=prepared.history.summarized,
        )
        if body.store:
            answered = prepared.history.extended({"role": "assistant", "content": text})
            await self.conversations.save(prepared.tenant, response, answered)
        return response, response_headers | routed.headers

    async def _events(
        self, body: ResponsesBody, prepared: Prepared, chunks: AsyncIterator[Any]
    ) -> AsyncIterator[bytes]:
        trimmed, sources, history = prepared.trimmed, prepared.sources, prepared.history
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
            sources=sources, summarized=history.summarized,
        )  # fmt: skip
        message = final["output"][-1]
        if body.store:
            # Stored before the last events: a client that has them may continue at once (on
            # another replica, perhaps), or hang up, which would end this generator here.
            answered = history.extended({"role": "assistant", "content": text})
            await self.conversations.save(prepared.tenant, final, answered)
        yield stream.event("response.output_item.done", output_index=position, item=message)
        done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield stream.event(done, response=final)

    async def get(self, response_id: str, api_key: str | None) -> dict[str, Any]:
        tenant = await self.pipeline.gate.auth.tenant_for(api_key)
        return await self.conversations.get(tenant, response_id)

    async def delete(self, response_id: str, api_key: str | None) -> dict[str, Any]:
        tenant = await self.pipeline.gate.auth.tenant_for(api_key)
        await self.conversations.delete(tenant, response_id)
        return {"id": response_id, "object": "response", "deleted": True}


def chat_request(
    chat: dict[str, Any], api_key: str | None, client_host: str | None, headers: dict
) -> ClientRequest:
    """A chat completion on the caller's behalf (its key: its limits, tenant and cache)."""
    return ClientRequest(
        endpoint="chat",
        parsed=ChatCompletionRequest.model_validate(chat),
        body=chat,
        request_id=f"req-{uuid.uuid4().hex}",
        headers=headers,
        api_key=api_key,
        client_host=client_host,
    )
