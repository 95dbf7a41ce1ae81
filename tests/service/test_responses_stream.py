"""A chat completion's stream as the Responses API's events: the order OpenAI sends them in,
sequence numbers from 0, items opened as their content starts (no empty message before tool
calls), response.incomplete when the output was cut, response.failed when the stream breaks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from titan.context.trimming import Trimmed
from titan.errors import UpstreamError
from titan.protocol import RawJSON
from titan.service.response_body import parse_body
from titan.service.response_objects import file_search_item
from titan.service.response_stream import ResponseStream

HEAD = {"id": "chatcmpl-1", "created": 1, "model": "m", "object": "chat.completion.chunk"}
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
TRIMMED = Trimmed([], 7, 0, 0)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **fields: Any) -> RawJSON:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return RawJSON(orjson.dumps({**HEAD, "choices": choices, **fields}))


def call_deltas(index: int, call_id: str, name: str, *arguments: str) -> list[RawJSON]:
    first = {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": ""},
    }
    rest = [{"index": index, "function": {"arguments": part}} for part in arguments]
    return [chunk({"tool_calls": [delta]}) for delta in [first, *rest]]


async def run(
    chunks: list[Any],
    *,
    body: dict | None = None,
    search: dict | None = None,
    sources: list[dict] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the events, the responses saved)."""
    saved: list[dict[str, Any]] = []

    async def save(response: dict[str, Any]) -> None:
        saved.append(response)

    async def source() -> AsyncIterator[Any]:
        for item in chunks:
            if isinstance(item, Exception):
                raise item
            yield item

    parsed = parse_body({"model": "m", "input": "Hi", "stream": True, **(body or {})})
    stream = ResponseStream(parsed, TRIMMED, sources or [], search, 0, save)
    events = []
    async for frame in stream.events(source()):
        kind, data = frame.decode().split("\n", 1)
        event = orjson.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events, saved


async def test_text_streams_in_openais_event_order():
    events, saved = await run(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, "stop"),
            chunk(usage=USAGE),
        ]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, added, delta, done_text = events[0], events[2], events[4], events[6]
    assert created["response"]["status"] == "in_progress" and created["response"]["output"] == []
    item_id = added["item"]["id"]
    assert added["output_index"] == 0 and added["item"]["status"] == "in_progress"
    assert delta["item_id"] == item_id and delta["content_index"] == 0 and delta["delta"] == "Hel"
    assert done_text["text"] == "Hello"
    final = events[-1]["response"]
    assert final["id"] == created["response"]["id"] and final["status"] == "completed"
    assert (
        final["output"][0]["id"] == item_id and final["output"][0]["content"][0]["text"] == "Hello"
    )
    assert final["usage"]["input_tokens"] == 7 and final["usage"]["output_tokens"] == 3
    assert saved == [final]


async def test_tool_calls_stream_as_function_call_items_without_an_empty_message():
    events, saved = await run(
        [
            *call_deltas(0, "call_a", "add", '{"a": ', "1}"),
            *call_deltas(1, "call_b", "mul", "{}"),
            chunk({}, "tool_calls"),
            chunk(usage=USAGE),
        ]
    )
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    first = events[2]["item"]
    assert first["type"] == "function_call" and first["call_id"] == "call_a"
    assert first["name"] == "add" and first["id"].startswith("fc_")
    assert events[5] == {
        **events[5],
        "item_id": first["id"],
        "output_index": 0,
        "arguments": '{"a": 1}',
    }
    assert events[7]["output_index"] == 1 and events[7]["item"]["call_id"] == "call_b"
    final = events[-1]["response"]
    assert [(o["type"], o["call_id"], o["arguments"], o["status"]) for o in final["output"]] == [
        ("function_call", "call_a", '{"a": 1}', "completed"),
        ("function_call", "call_b", "{}", "completed"),
    ]
    assert saved[0]["output"] == final["output"]


async def test_text_then_a_call_closes_the_message_first():
    events, _ = await run(
        [
            chunk({"content": "Let me check."}),
            *call_deltas(0, "call_a", "add", "{}"),
            chunk({}, "tool_calls"),
        ]
    )
    kinds = [e["type"] for e in events]
    assert kinds.index("response.content_part.done") < kinds.index("response.output_item.done")
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "message"),
        (1, "function_call"),
    ]
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["message", "function_call"]


async def test_a_cut_output_ends_with_response_incomplete():
    events, saved = await run([chunk({"content": "Once upon"}), chunk({}, "length")])
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    filtered, _ = await run([chunk({}, "content_filter")])
    assert filtered[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}
    # Nothing came: still one (empty) message, as a whole answer has.
    assert [e["type"] for e in filtered][2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
    ]
    assert saved[0]["status"] == "incomplete"


async def test_a_broken_stream_ends_with_response_failed_and_is_not_stored():
    broken = UpstreamError("upstream hung up", status_code=502, is_retryable=False)
    events, saved = await run([chunk({"content": "Hel"}), broken])
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["message"] == "upstream hung up"
    assert saved == []


SOURCE = {
    "file_id": "f",
    "filename": "a.md",
    "score": 0.9,
    "content": [{"type": "text", "text": "16 weeks"}],
}


async def test_a_file_search_streams_its_progress_and_its_citations():
    search = file_search_item([SOURCE], "leave?")
    events, _ = await run([chunk({"content": "16 weeks."}), chunk({}, "stop")], search=search,
                          sources=[SOURCE])  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds[2:7] == [
        "response.output_item.added",
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.file_search_call.completed",
        "response.output_item.done",
    ]
    assert (
        events[2]["item"]["status"] == "in_progress" and events[6]["item"]["status"] == "completed"
    )
    assert all(e["item_id"] == search["id"] and e["output_index"] == 0 for e in events[3:6])
    cited = kinds.index("response.output_text.annotation.added")
    assert kinds[cited + 1] == "response.output_text.done"
    annotation = events[cited]
    assert (annotation["output_index"], annotation["content_index"]) == (1, 0)
    assert annotation["annotation_index"] == 0
    assert annotation["annotation"] == {"type": "file_citation", "file_id": "f",
                                        "filename": "a.md", "index": 9}  # fmt: skip
    assert events[-1]["response"]["output"][1]["content"][0]["annotations"] == [
        annotation["annotation"]
    ]


async def test_file_search_results_and_logprobs_follow_include():
    search = file_search_item([SOURCE], "leave?")
    logprobs = {
        "content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]
    }
    chunks = [
        RawJSON(
            orjson.dumps(
                {
                    **HEAD,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": "Hi"},
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ],
                }
            )
        ),
        chunk({}, "stop"),
    ]
    events, saved = await run(chunks, search=search)
    assert events[2]["item"]["type"] == "file_search_call" and events[2]["item"]["results"] is None
    assert events[6]["item"]["results"] is None
    assert events[-1]["response"]["output"][0]["results"] is None
    assert saved[0]["output"][0]["results"][0]["text"] == "16 weeks"  # stored whole
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["output_index"] == 1 and delta["logprobs"] == []
    include = ["file_search_call.results", "message.output_text.logprobs"]
    events, _ = await run(chunks, search=search, body={"include": include})
    assert events[-1]["response"]["output"][0]["results"][0]["text"] == "16 weeks"
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["logprobs"][0]["token"] == "Hi"
    assert events[-1]["response"]["output"][1]["content"][0]["logprobs"][0]["logprob"] == -0.1
