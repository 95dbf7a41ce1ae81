"""A forced ``required`` reply that repeats a call ends there.

Forced to call, SmolLM2-135M writes its one call again and again (`[{"name": "add", ...},
{"name": "add", ...}, ...`) until the array's cap or max_tokens. The reply is a JSON array of
calls, read only when whole (tool_parser.parse_forced_calls), so the engine's text can
be held here: when an item closes that equals an earlier one (same name, same arguments), the
array is cut after the item before it and closed, and the request stops. The same calls come
back as without the cut, sooner and without the wasted tokens.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace

from titan.engine.outputs import FinishReason, RequestOutput


class RepeatedCallCut:
    """Scans the array's text as it comes: depth outside strings, where each item starts and
    ends."""

    def __init__(self) -> None:
        self.text = ""
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._item_start = 0
        self._last_item_end = 0  # just after the last item kept
        self._seen: set[str] = set()

    def feed(self, piece: str) -> str | None:
        """Adds text; the whole reply, cut and closed, once an item repeats; else None."""
        start = len(self.text)
        self.text += piece
        for position in range(start, len(self.text)):
            char = self.text[position]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "[{":
                self._depth += 1
                if self._depth == 2:
                    self._item_start = position
            elif char in "]}":
                self._depth -= 1
                if self._depth == 1 and self._is_repeat(position + 1):
                    return self.text[: self._last_item_end] + "]"
        return None

    def _is_repeat(self, end: int) -> bool:
        try:
            key = json.dumps(json.loads(self.text[self._item_start : end]), sort_keys=True)
        except ValueError:
            return False
        if key in self._seen:
            return True
        self._seen.add(key)
        self._last_item_end = end
        return False


async def cut_repeated_calls(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """The outputs with their text held back to the last one, which carries it all: whole, or
    cut at the first repeated call (then finished with "stop"; leaving the stream aborts the
    request)."""
    cut = RepeatedCallCut()
    async for output in outputs:
        reply = cut.feed(output.text)
        if reply is not None:
            yield replace(output, text=reply, is_finished=True, finish_reason=FinishReason.STOP)
            return
        yield replace(output, text=cut.text if output.is_finished else "")
        if output.is_finished:
            return
