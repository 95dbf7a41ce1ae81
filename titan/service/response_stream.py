"""A chat completion's stream re-framed as the Responses API's events, in the order OpenAI sends
them and the openai SDK's stream helper checks: response.created, response.in_progress, then per
output item response.output_item.added, its content (a message: content_part.added,
output_text.delta..., output_text.done, content_part.done; a function call:
function_call_arguments.delta..., function_call_arguments.done), response.output_item.done, and
last response.completed, or response.incomplete when the output was cut, or response.failed.
Every event has a ``sequence_number`` counting from 0."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson

from titan.context.trimming import Trimmed
from titan.errors import TitanError
from titan.protocol import answer_bytes
from titan.service.response_body import LOGPROBS, ResponsesBody, output_logprobs
from titan.service.response_items import function_call_item, message_item, new_item_id
from titan.service.response_objects import (
    EventWriter,
    citations,
    cut_reason,
    presented,
    response_object,
)

logger = logging.getLogger("titan.service")


class OutputEvents:
    """The output items of a stream and their events. An item opens when its content starts (a
    message at its first text, a function call at its first delta) and is done when the next
    one opens or the stream ends."""

    def __init__(self, writer: EventWriter, sources: list[dict], with_logprobs: bool):
        self.writer = writer
        self.sources = sources
        self.with_logprobs = with_logprobs
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._texts: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._calls: dict[int, dict[str, Any]] = {}  # the chat delta's index → its item

    def search_item(self, item: dict[str, Any]) -> list[bytes]:
        """The file_search call, which ran before the stream started: added, its progress
        events, done."""
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        added = {**item, "status": "in_progress", "results": None}
        return [
            self._event(
                "response.output_item.added", output_index=where["output_index"], item=added
            ),
            *[
                self._event(f"response.file_search_call.{stage}", **where)
                for stage in ("in_progress", "searching", "completed")
            ],
            self._event("response.output_item.done", output_index=where["output_index"], item=item),
        ]

    def text(self, delta: str, logprobs: Mapping[str, Any] | None) -> list[bytes]:
        events = [] if self._is_open("message") else self._open_message()
        entries = output_logprobs(logprobs) if self.with_logprobs else []
        self._texts.append(delta)
        self._logprobs += entries
        return [
            *events,
            self._event(
                "response.output_text.delta", **self._where(), delta=delta, logprobs=entries
            ),
        ]

    def call(self, delta: Mapping[str, Any]) -> list[bytes]:
        function = delta.get("function") or {}
        item = self._calls.get(delta.get("index", 0))
        events: list[bytes] = []
        if item is None:
            events = self._close()
            item = function_call_item(
                new_item_id("fc"),
                delta.get("id") or new_item_id("call"),
                function.get("name") or "",
                "",
                status="in_progress",
            )
            self._calls[delta.get("index", 0)] = item
            self._add(item)
            events.append(
                self._event("response.output_item.added", output_index=self._index(item), item=item)
            )
        arguments = function.get("arguments")
        if arguments:
            item["arguments"] += arguments
            if item is self._open:  # a late delta of an item already done shows in the end
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self._index(item),
                        delta=arguments,
                    )
                )
        return events

    def finish(self, finish_reason: str | None) -> list[bytes]:
        """The last item done (an empty message when nothing came)."""
        status = "incomplete" if cut_reason(finish_reason) else "completed"
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            return self._open_message() + self._close(status)
        return self._close(status)

    # ---- internals --------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        return self.writer.event(kind, **fields)

    def _is_open(self, kind: str) -> bool:
        return self._open is not None and self._open["type"] == kind

    def _index(self, item: Mapping[str, Any]) -> int:
        return next(i for i, each in enumerate(self.items) if each is item)

    def _add(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self._open = item

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {
            "item_id": self._open["id"],
            "output_index": self._index(self._open),
            "content_index": 0,
        }

    def _open_message(self) -> list[bytes]:
        events = self._close()
        item = message_item(new_item_id("msg"), "", status="in_progress")
        item["content"] = []
        self._add(item)
        self._texts, self._logprobs = [], []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            *events,
            self._event("response.output_item.added", output_index=self._index(item), item=item),
            self._event("response.content_part.added", **self._where(), part=part),
        ]

    def _close(self, status: str = "completed") -> list[bytes]:
        item = self._open
        if item is None:
            return []
        index = self._index(item)
        if item["type"] == "function_call":
            item["status"] = status
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            ]
        else:
            text = "".join(self._texts)
            done = message_item(
                item["id"],
                text,
                status=status,
                logprobs=self._logprobs,
                annotations=citations(self.sources, len(text)),
            )
            item.update(done)
            where = self._where()
            annotations = item["content"][0]["annotations"]
            events = [
                *[
                    self._event(
                        "response.output_text.annotation.added",
                        **where,
                        annotation_index=number,
                        annotation=annotation,
                    )
                    for number, annotation in enumerate(annotations)
                ],
                self._event(
                    "response.output_text.done", **where, text=text, logprobs=self._logprobs
                ),
                self._event("response.content_part.done", **where, part=item["content"][0]),
            ]
        self._open = None
        return [*events, self._event("response.output_item.done", output_index=index, item=item)]


class ResponseStream:
    """The events of one streamed response; ``save`` stores the finished response (when
    ``store``) before its last events go out, so a client that has them can continue at once."""

    def __init__(
        self,
        body: ResponsesBody,
        trimmed: Trimmed,
        sources: list[dict],
        search: dict[str, Any] | None,
        summarized: int,
        save: Callable[[dict[str, Any]], Awaitable[None]] | None,
    ):
        self.body, self.trimmed, self.sources, self.search = body, trimmed, sources, search
        self.summarized, self.save = summarized, save

    def _snapshot(
        self,
        response: dict[str, Any],
        model: str,
        items: list[dict[str, Any]],
        finish: str | None,
        usage: dict[str, Any] | None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The response object as it stands, under the id and time of ``response.created``."""
        return response_object(
            self.body, model, items, finish, usage, self.trimmed,
            response_id=response["id"], created_at=response["created_at"], **extra,
        )  # fmt: skip

    async def events(self, chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        body, includes = self.body, self.body.includes
        writer = EventWriter()
        response = response_object(
            body, body.model or "", [], None, None, self.trimmed, status="in_progress"
        )
        yield writer.event("response.created", response=response)
        yield writer.event("response.in_progress", response=response)
        output = OutputEvents(writer, self.sources, LOGPROBS in includes)
        if self.search is not None:  # the search already ran: its item comes first, done
            for event in output.search_item(
                presented({"output": [self.search]}, includes)["output"][0]
            ):
                yield event
        finish, usage, model = None, None, body.model or ""
        try:
            async for chunk in chunks:
                data = orjson.loads(answer_bytes(chunk))
                model = data.get("model", model)
                usage = data.get("usage") or usage
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        for event in output.text(delta["content"], choice.get("logprobs")):
                            yield event
                    for call in delta.get("tool_calls") or ():
                        for event in output.call(call):
                            yield event
                    finish = choice.get("finish_reason") or finish
        except TitanError as exc:  # the status code is sent: the failure is an event
            logger.warning("response stream failed: %s", exc.message, extra={"code": exc.code})
            failed = self._snapshot(response, model, output.items, None, usage, status="failed")
            code = "rate_limit_exceeded" if exc.status_code == 429 else "server_error"
            failed["error"] = {"code": code, "message": exc.message}
            yield writer.event("response.failed", response=failed)
            return
        last = output.finish(finish)
        if self.search is not None:
            output.items[0] = self.search  # stored with its results
        final = self._snapshot(
            response, model, output.items, finish, usage, summarized=self.summarized
        )
        if self.save is not None:
            await self.save(final)
        for event in last:
            yield event
        done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield writer.event(done, response=presented(final, includes))
