"""The Responses API over the pipeline: a stored conversation continued by
``previous_response_id`` (or sent whole, tool calls and results included), trimmed to the
model's window by tokens, run as a chat completion with the request's function tools (auth,
cache, admission and routing included), answered as a Response object or its stream of events,
and stored for the next turn and for GET .../input_items. The body is response_body.py's, the
tools response_tools.py's, the items response_items.py's, the events response_stream.py's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from titan.config.admission import ContextConfig
from titan.context.conversations import Conversations, History
from titan.context.trimming import Trimmed, trim, turns
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, ClientContext, ClientRequest, answer_bytes
from titan.service.authentication import Authenticator
from titan.service.rag import RagService
from titan.service.requests import RequestFlow
from titan.service.response_body import (
    LOGPROBS,
    ResponsesBody,
    chat_options,
    check_include,
    parse_body,
)
from titan.service.response_items import (
    answer_message,
    counted_messages,
    input_messages,
    items_page,
    newest_user_text,
    prompt_messages,
    stored_items,
    transcript_line,
)
from titan.service.response_objects import (
    answer_items,
    file_search_item,
    presented,
    response_object,
    sources_prompt,
)
from titan.service.response_stream import ResponseStream
from titan.service.response_tools import ToolPlan, plan_tools
from titan.storage.base import DocumentStore

__all__ = ["ResponsesBody", "ResponsesService", "chat_request", "parse_body"]

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
    the trimmed prompt, the chat completion to run, its tools, and the file_search that ran
    (its sources and its output item)."""

    tenant: str
    history: History
    trimmed: Trimmed
    request: ClientRequest
    tools: ToolPlan
    sources: list[dict]
    search: dict[str, Any] | None


class ResponsesService:
    def __init__(
        self,
        flow: RequestFlow,
        auth: Authenticator,
        documents: DocumentStore,
        rag: RagService,
        config: ContextConfig,
    ):
        self.flow = flow
        self.auth = auth
        self.conversations = Conversations(documents)
        self.rag = rag
        self.config = config

    async def _prepare(self, body: ResponsesBody, client: ClientContext) -> Prepared:
        tenant = await self.auth.tenant_for(client.api_key)
        models = self.flow.models
        model = models.card(body.model or models.ids()[0])
        tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
        earlier = await self.conversations.continued(tenant, body.previous_response_id)
        history = earlier.extended(*input_messages(body.input))
        conversation = history.messages
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        query = newest_user_text(conversation)
        sources = await self._file_search(tenant, tools.file_search, query)
        search = file_search_item(sources, query) if tools.file_search else None
        if sources:
            system.append({"role": "system", "content": sources_prompt(sources)})
        count_tokens = models.prompt_token_counter(model.id)
        described = tools.chat.get("tools") if tools.chat.get("tool_choice") != "none" else None

        def count(messages: list[dict[str, Any]]) -> int:
            return int(count_tokens(counted_messages(messages, tools=described)))

        output_tokens = body.max_output_tokens or DEFAULT_OUTPUT_TOKENS
        if model.max_model_len:
            context = self.config
            limit = model.max_model_len - output_tokens - RESERVE_TOKENS
            budget = limit
            if body.truncation != "disabled":  # else only the model's window may refuse a turn
                window = context.conversation_window or models.conversation_window(model.id)
                budget = min(limit, window or limit)
            target = int(budget * (1 - context.trim_headroom))
            trimmed = trim(system + conversation, count, budget,
                           keep_dropped=history.dropped, target=target, limit=limit)  # fmt: skip
            if trimmed.num_dropped_messages and body.truncation == "disabled":
                raise InvalidRequestError(
                    f"The conversation does not fit the model's window ({trimmed.num_dropped_turns}"
                    " turns would be left out) and 'truncation' is 'disabled'. Set 'truncation' to "
                    "'auto' to trim the oldest turns.",
                    param="input",
                    code="context_length_exceeded",
                )
            history = replace(history, dropped=trimmed.num_dropped_messages)
            if trimmed.num_dropped_messages and context.summary_model:
                trimmed, history = await self._summarized(
                    context.summary_model, system, history, count, (budget, limit), client
                )
            trimmed = replace(trimmed, budget=budget)
        else:  # an upstream that does not say its window: nothing to trim against
            trimmed = Trimmed(system + conversation, count(system + conversation), 0, 0)
        chat = {"model": model.id, "messages": prompt_messages(trimmed.messages),
                "stream": body.stream, **chat_options(body), **tools.chat}  # fmt: skip
        if body.stream:
            chat["stream_options"] = {"include_usage": True}
        request = chat_request(chat, client)
        if self.config.context_shift:
            request = replace(request, shift_scope=f"{tenant}/{history.thread}")
        return Prepared(tenant, history, trimmed, request, tools, sources, search)

    async def _summarized(
        self,
        summary_model: str,
        system: list[dict],
        history: History,
        count: Any,
        budgets: tuple[int, int],
        client: ClientContext,
    ) -> tuple[Trimmed, History]:
        """The prompt with the dropped messages replaced by the running summary (extended
        when more fell out since the last request)."""
        conversation, summary, summarized = history.messages, history.summary, history.summarized
        if history.dropped > summarized:
            summary = await self._summarize(
                summary_model, summary, conversation[summarized : history.dropped], client
            )  # fmt: skip
            summarized = history.dropped
        note = {"role": "system", "content": f"Earlier in this conversation: {summary}"}
        budget, limit = budgets
        trimmed = trim([*system, note, *conversation[summarized:]], count, budget, limit=limit)
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
        client: ClientContext,
    ) -> str:
        """The running summary, extended with ``messages``, written by the configured model."""
        transcript = "\n".join(transcript_line(m) for m in messages)
        earlier = f"Summary so far: {summary}\n\n" if summary else ""
        prompt = (
            f"{earlier}More of the conversation:\n{transcript}\n\nWrite a short summary of "
            "the whole conversation so far: the facts, names and decisions a reader needs."
        )
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.config.summary_max_tokens,
            "temperature": 0,
        }
        # As its caller, without its headers: the summary is Titan's request, not the client's.
        request = chat_request(
            chat, ClientContext(api_key=client.api_key, client_host=client.client_host)
        )
        answer = orjson.loads(answer_bytes((await self.flow.complete(request)).value))
        return str(answer["choices"][0]["message"].get("content") or "").strip()

    async def _file_search(self, tenant: str, tools: list[dict], query: str) -> list[dict]:
        """The file_search tools: the best chunks of the named vector stores for the newest
        user input, which the model is given with numbered source markers."""
        stores: list[str] = []
        limit, ranking = DEFAULT_SOURCES, None
        for tool in tools:
            stores += tool["vector_store_ids"]
            limit = tool.get("max_num_results") or limit
            ranking = tool.get("ranking_options", ranking)
        if not stores:
            return []
        vector_stores = self.rag.stores()
        found = []
        for store_id in stores:
            page = await vector_stores.search(tenant, store_id, query, limit, ranking)
            found += page["data"]
        return sorted(found, key=lambda r: r["score"], reverse=True)[:limit]

    async def create(
        self, data: Mapping[str, Any], client: ClientContext
    ) -> tuple[dict[str, Any] | AsyncIterator[bytes], dict[str, str]]:
        body = parse_body(data)
        prepared = await self._prepare(body, client)
        trimmed, sources, history = prepared.trimmed, prepared.sources, prepared.history
        response_headers = {
            TRIMMED_HEADER: f"turns={trimmed.num_dropped_turns};"
            f"messages={trimmed.num_dropped_messages}"
        }
        try:
            if body.stream:
                routed = await self.flow.stream(prepared.request)
            else:
                routed = await self.flow.complete(prepared.request)
        except InvalidRequestError as exc:  # about a chat tool: say which Responses tool
            raise prepared.tools.renamed(exc) from None
        response_headers |= routed.headers
        if body.stream:
            stream = ResponseStream(
                body, trimmed, sources, prepared.search, history.summarized,
                self._saver(prepared) if body.store else None,
            )  # fmt: skip
            return stream.events(routed.value), response_headers
        answer = orjson.loads(answer_bytes(routed.value))
        choice = answer["choices"][0]
        search = [prepared.search] if prepared.search is not None else []
        output = search + answer_items(choice, sources, LOGPROBS in body.includes)
        response = response_object(
            body, routed.model, output, choice.get("finish_reason"), answer.get("usage"),
            trimmed, summarized=history.summarized,
        )  # fmt: skip
        if body.store:
            await self._saver(prepared)(response)
        return presented(response, body.includes), response_headers

    def _saver(self, prepared: Prepared) -> Callable[[dict[str, Any]], Awaitable[None]]:
        """Stores a finished response with its conversation, answer included."""

        async def save(response: dict[str, Any]) -> None:
            answered = prepared.history.extended(answer_message(response["output"]))
            await self.conversations.save(prepared.tenant, response, answered)

        return save

    async def get(
        self, response_id: str, api_key: str | None, include: list[str] | None = None
    ) -> dict[str, Any]:
        includes = check_include(include)
        tenant = await self.auth.tenant_for(api_key)
        return presented(await self.conversations.get(tenant, response_id), includes)

    async def input_items(
        self,
        response_id: str,
        api_key: str | None,
        *,
        order: str = "desc",
        after: str | None = None,
        limit: int = 20,
        include: list[str] | None = None,
    ) -> dict[str, Any]:
        """The items the response answered: the conversation before its output (the turns of
        the responses it continues too), newest first unless ``order`` is "asc"."""
        check_include(include)  # nothing listed here has what they add
        tenant = await self.auth.tenant_for(api_key)
        messages = await self.conversations.messages(tenant, response_id)
        items = stored_items(messages[:-1], response_id)  # the last message is its answer
        return items_page(items, order=order, after=after, limit=limit)

    async def delete(self, response_id: str, api_key: str | None) -> dict[str, Any]:
        tenant = await self.auth.tenant_for(api_key)
        await self.conversations.delete(tenant, response_id)
        return {"id": response_id, "object": "response", "deleted": True}


def chat_request(chat: dict[str, Any], client: ClientContext) -> ClientRequest:
    """A chat completion on the caller's behalf (its key: its limits, tenant and cache)."""
    parsed = ChatCompletionRequest.model_validate(chat)
    return ClientRequest.sent(client, "chat", parsed, chat, f"req-{uuid.uuid4().hex}")
