"""A forced "required" reply is cut at its first repeated call (backends/embedded/call_cut.py):
the scanner finds items by depth outside strings, whatever braces or escapes the strings hold."""

from __future__ import annotations

import asyncio
import json

from titan.backends.embedded.call_cut import RepeatedCallCut, cut_repeated_calls
from titan.engine.outputs import FinishReason, RequestOutput

ADD = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
ODD = '{"name": "say", "arguments": {"text": "a } ] \\" {[ b"}}'


def fed(text: str, piece_size: int) -> str | None:
    cut = RepeatedCallCut()
    for start in range(0, len(text), piece_size):
        reply = cut.feed(text[start : start + piece_size])
        if reply is not None:
            return reply
    return None


def test_a_repeated_call_cuts_the_array_after_the_call_before_it():
    text = f"[{ADD}, {ODD}, {ADD}, {ODD}]"
    for size in (1, 3, 7, len(text)):
        reply = fed(text, size)
        assert reply == f"[{ADD}, {ODD}]"
        assert [item["name"] for item in json.loads(reply)] == ["add", "say"]


def test_the_same_call_written_another_way_is_a_repeat():
    other_order = '{"arguments": {"b": 2, "a": 1}, "name": "add"}'
    assert fed(f"[{ADD}, {other_order}", 4) == f"[{ADD}]"


def test_different_calls_and_strings_with_brackets_are_left_alone():
    text = f"[{ODD}, {ADD.replace('1', '5')}, {ADD}]"
    assert fed(text, 2) is None
    assert fed('[{"name": "say", "arguments": {"text": "}, {\\"name\\""}}]', 1) is None


def test_the_outputs_carry_the_whole_reply_at_the_end_and_stop_at_a_repeat():
    pieces = ["[", ADD[:10], ADD[10:], ", ", ADD, ", ", ADD]

    async def engine_outputs():
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            yield RequestOutput(
                request_id="r", text=piece, token_ids=(index,), logprobs=None,
                is_finished=last, finish_reason=FinishReason.LENGTH if last else None,
                stop_reason=None, num_prompt_tokens=3, num_output_tokens=index + 1,
                num_cached_tokens=0,
            )  # fmt: skip

    async def collect():
        return [output async for output in cut_repeated_calls(engine_outputs())]

    outputs = asyncio.run(collect())
    assert "".join(output.text for output in outputs) == f"[{ADD}]"
    assert outputs[-1].is_finished and outputs[-1].finish_reason == FinishReason.STOP
    assert len(outputs) == 5  # the repeat closed at the fifth piece: nothing read after it
