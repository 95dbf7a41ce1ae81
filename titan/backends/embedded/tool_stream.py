"""One streamed choice's text turned into OpenAI chat deltas under a tool plan.

Content streams as it comes, except what could still be the start of ``<tool_call>`` (held until
it cannot) and trailing whitespace (dropped if a call follows, as the whole-reply parser strips
it). A call block is held until its closing marker, then sent as OpenAI sends calls: a delta
with the call's index, id, type and name (arguments ""), then its arguments. A named forced
call streams its arguments token by token (the name is known before the model starts); a
``required`` reply (a JSON array) is read when it is whole.
"""

from __future__ import annotations

from titan.backends.embedded.tool_parser import (
    call_from_block,
    new_call_id,
    parse_forced_calls,
)
from titan.backends.embedded.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolPlan
from titan.protocol.chat import ChatDelta, ToolCall, ToolCallDelta, ToolCallFunctionDelta


def _held_prefix_length(text: str, marker: str) -> int:
    """The length of the longest tail of ``text`` that begins ``marker``."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def _header(index: int, call_id: str, name: str) -> ChatDelta:
    function = ToolCallFunctionDelta(name=name, arguments="")
    call = ToolCallDelta(index=index, id=call_id, type="function", function=function)
    return ChatDelta(tool_calls=[call])


def _arguments(index: int, fragment: str) -> ChatDelta:
    function = ToolCallFunctionDelta(arguments=fragment)
    return ChatDelta(tool_calls=[ToolCallDelta(index=index, function=function)])


class ToolCallStream:
    def __init__(self, plan: ToolPlan):
        self._plan = plan
        self._names = {tool["function"]["name"] for tool in plan.tools}
        self._buffer = ""  # text received and not yet sent (or, for "required", all of it)
        self._is_in_block = False
        self._pending_space = ""  # trailing whitespace of the content sent so far
        self.num_calls = 0

    def feed(self, text: str) -> list[ChatDelta]:
        mode = self._plan.mode
        if mode == "none":
            return [ChatDelta(content=text)] if text else []
        if mode == "named":
            deltas = []
            if self.num_calls == 0:
                self.num_calls = 1
                deltas.append(_header(0, new_call_id(), self._plan.forced_name or ""))
            if text:
                deltas.append(_arguments(0, text))
            return deltas
        self._buffer += text
        if mode == "required":
            return []  # read when whole, in finish()
        return self._scan()

    def finish(self) -> list[ChatDelta]:
        """The deltas for whatever is still held, once the choice has ended."""
        mode = self._plan.mode
        if mode == "required":
            calls = parse_forced_calls(self._buffer, self._plan)
            if not calls:
                return [ChatDelta(content=self._buffer)] if self._buffer else []
            return [delta for call in calls for delta in self._call_deltas(call)]
        if mode != "auto":
            return self.feed("") if mode == "named" else []
        deltas = []
        if self._is_in_block:
            # An unclosed block at the end still counts if its JSON is whole (stopped at EOS).
            deltas = self._block(self._buffer) or self._content(TOOL_CALL_OPEN + self._buffer)
        elif self._buffer:
            deltas = self._content(self._buffer)
        self._buffer = ""
        if self._pending_space and not self.num_calls:
            deltas.append(ChatDelta(content=self._pending_space))
        self._pending_space = ""
        return deltas

    def _scan(self) -> list[ChatDelta]:
        deltas: list[ChatDelta] = []
        while True:
            if self._is_in_block:
                end = self._buffer.find(TOOL_CALL_CLOSE)
                if end == -1:
                    return deltas
                body = self._buffer[:end]
                self._buffer = self._buffer[end + len(TOOL_CALL_CLOSE) :]
                self._is_in_block = False
                deltas += self._block(body) or self._content(
                    TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE
                )
                continue
            start = self._buffer.find(TOOL_CALL_OPEN)
            if start == -1:
                held = _held_prefix_length(self._buffer, TOOL_CALL_OPEN)
                ready = self._buffer[: len(self._buffer) - held]
                self._buffer = self._buffer[len(ready) :]
                return deltas + self._content(ready)
            deltas += self._content(self._buffer[:start])
            self._buffer = self._buffer[start + len(TOOL_CALL_OPEN) :]
            self._is_in_block = True

    def _content(self, text: str) -> list[ChatDelta]:
        text = self._pending_space + text
        stripped = text.rstrip()
        self._pending_space = text[len(stripped) :]
        return [ChatDelta(content=stripped)] if stripped else []

    def _block(self, body: str) -> list[ChatDelta]:
        """A closed block's deltas as a call; [] when it is not one (then it is content)."""
        max_calls = self._plan.max_calls
        if max_calls is not None and self.num_calls >= max_calls:
            return []
        call = call_from_block(body, self._names)
        if call is None:
            return []
        self._pending_space = ""  # whitespace between text and a call is not content
        return self._call_deltas(call)

    def _call_deltas(self, call: ToolCall) -> list[ChatDelta]:
        index = self.num_calls
        self.num_calls += 1
        return [
            _header(index, call.id, call.function.name),
            _arguments(index, call.function.arguments),
        ]
