"""Cached answers in and out: a stream assembles into the whole answer it amounts to, and a
replayed stream carries the same content, tool calls, finish reasons and usage."""

from __future__ import annotations

import orjson

from titan.protocol import RawJSON, answer_bytes
from titan.service.cache_replay import StreamAssembler, replay_stream, replay_whole

HEAD = {"id": "chatcmpl-1", "created": 1, "model": "m", "object": "chat.completion.chunk"}
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def chunk(**fields) -> RawJSON:
    return RawJSON(orjson.dumps({**HEAD, **fields}))


def chat_stream() -> list[RawJSON]:
    return [
        chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
        chunk(choices=[{"index": 0, "delta": {"content": "Hel"}}]),
        chunk(choices=[{"index": 0, "delta": {"content": "lo"}}]),
        chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        chunk(choices=[], usage=USAGE),
    ]


def assemble(chunks, endpoint: str = "chat") -> dict:
    assembler = StreamAssembler(endpoint)
    for piece in chunks:
        assembler.add(piece)
    whole = assembler.whole()
    assert whole is not None
    return orjson.loads(whole)


async def test_a_stream_is_stored_as_its_whole_answer_and_replays_the_same():
    whole = assemble(chat_stream())
    assert whole["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}
    ]
    assert whole["usage"] == USAGE
    replayed = [c async for c in replay_stream(orjson.dumps(whole), "chat", include_usage=True)]
    again = assemble(replayed)
    assert again["choices"] == whole["choices"]
    assert again["usage"] == USAGE
    assert again["id"] != "chatcmpl-1"  # a new response
    without_usage = [c async for c in replay_stream(orjson.dumps(whole), "chat", False)]
    assert all(b'"usage"' not in answer_bytes(c) for c in without_usage)


async def test_tool_calls_and_several_choices_are_merged_by_index():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    chunks = [
        chunk(choices=[{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]),
        chunk(
            choices=[
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                }
            ]
        ),
        chunk(
            choices=[
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                }
            ]
        ),
        chunk(choices=[{"index": 1, "delta": {"content": "No tools."}}]),
        chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        chunk(choices=[{"index": 1, "delta": {}, "finish_reason": "stop"}]),
    ]
    whole = assemble(chunks)
    tool_call = whole["choices"][0]["message"]["tool_calls"][0]
    assert tool_call["id"] == "call_1"
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert whole["choices"][1]["message"]["content"] == "No tools."
    replayed = [c async for c in replay_stream(orjson.dumps(whole), "chat", include_usage=False)]
    assert assemble(replayed)["choices"] == whole["choices"]


def test_a_stream_cut_short_or_failing_is_not_stored():
    cut = StreamAssembler("chat")
    for piece in chat_stream()[:3]:
        cut.add(piece)
    assert cut.whole() is None
    failed = StreamAssembler("chat")
    failed.add(chat_stream()[0])
    failed.add(RawJSON(b'{"error": {"message": "boom"}}'))
    failed.add(chat_stream()[3])
    assert failed.whole() is None


async def test_completions_round_trip():
    head = {"id": "cmpl-1", "created": 1, "model": "m", "object": "text_completion"}
    chunks = [
        RawJSON(orjson.dumps({**head, "choices": [{"index": 0, "text": "Once"}]})),
        RawJSON(
            orjson.dumps(
                {**head, "choices": [{"index": 0, "text": " upon", "finish_reason": "length"}]}
            )
        ),
    ]
    whole = assemble(chunks, "completion")
    assert whole["choices"] == [{"index": 0, "text": "Once upon", "finish_reason": "length"}]
    replayed = [c async for c in replay_stream(orjson.dumps(whole), "completion", False)]
    assert assemble(replayed, "completion")["choices"] == whole["choices"]
    answer = orjson.loads(answer_bytes(replay_whole(orjson.dumps(whole), "completion")))
    assert answer["choices"] == whole["choices"] and answer["id"].startswith("cmpl-")
