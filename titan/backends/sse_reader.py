"""An incremental server-sent events decoder for upstream streams.

Tolerant of every dialect the OpenAI-compatible servers speak: ``data:`` with or without the
space (TGI writes ``data:{...}``), data spread over several lines (joined with newlines, as the SSE
spec says), comments (``: ping``, TGI's ``:`` keep-alives), ``event:``/``id:``/``retry:`` fields,
LF, CRLF or CR line endings, and network chunks that split lines anywhere. llama.cpp's server
reports stream failures on a non-standard ``error:`` line, which is decoded as an ``error`` event.

Payloads are slices of the bytes received, never decoded or re-encoded: a single-line ``data:``
event comes out byte-identical.
"""

from __future__ import annotations

ERROR_EVENT = b"error"
MESSAGE_EVENT = b""  # the SSE default event type
# A line (or one event's data) longer than this is a broken upstream, not a big answer.
MAX_PENDING_BYTES = 16 * 1024 * 1024

_CR = 0x0D
_COLON = 0x3A
_DONE = b"[DONE]"

# (event type, data): the event type is MESSAGE_EVENT unless an ``event:`` line named another.
Event = tuple[bytes, bytes]


class SSEProtocolError(ValueError):
    """The upstream's stream cannot be SSE (an endless line)."""


def is_done(data: bytes) -> bool:
    """The ``[DONE]`` sentinel that ends OpenAI streams (tolerating stray whitespace)."""
    return data == _DONE or (len(data) < 16 and data.strip() == _DONE)


class SSEDecoder:
    """Feed network chunks, get complete events back; ``finish()`` at the end of the body."""

    def __init__(self) -> None:
        # An incomplete last line, in pieces (joined once it completes: no quadratic copying when
        # a big event arrives in many network chunks). Never contains a line terminator.
        self._pending: list[bytes] = []
        self._num_pending_bytes = 0
        self._skip_leading_lf = False  # the previous chunk ended in CR: a CRLF may be split
        self._data: bytes | None = None
        self._event_type = MESSAGE_EVENT

    def feed(self, chunk: bytes) -> list[Event]:
        if self._skip_leading_lf:
            self._skip_leading_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if end < 0:
            self._keep_pending(chunk)
            return []
        complete = chunk[: end + 1]  # the whole chunk, uncopied, in the common case
        if self._pending:
            self._pending.append(complete)
            complete = b"".join(self._pending)
            self._pending = []
            self._num_pending_bytes = 0
        self._keep_pending(chunk[end + 1 :])
        self._skip_leading_lf = chunk[end] == _CR and end == len(chunk) - 1
        events: list[Event] = []
        for line in complete.splitlines():
            self._line(line, events)
        return events

    def finish(self) -> list[Event]:
        """The end of the body. Lenient: an event without its closing blank line still counts
        (the spec would drop it), since some servers end the body right after the last event."""
        events: list[Event] = []
        if self._pending:
            self._line(b"".join(self._pending), events)
            self._pending = []
            self._num_pending_bytes = 0
        self._line(b"", events)
        return events

    def _keep_pending(self, piece: bytes) -> None:
        if not piece:
            return
        self._pending.append(piece)
        self._num_pending_bytes += len(piece)
        if self._num_pending_bytes > MAX_PENDING_BYTES:
            raise SSEProtocolError(f"an SSE line longer than {MAX_PENDING_BYTES} bytes")

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:  # a blank line dispatches the event
            if self._data:
                events.append((self._event_type, self._data))
            self._data = None
            self._event_type = MESSAGE_EVENT
            return
        if line[0] == _COLON:  # a comment: keep-alives
            return
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if field == b"data":
            self._append(value)
        elif field == b"event":
            self._event_type = value
        elif field == ERROR_EVENT:  # llama.cpp: "error: {...}"
            self._event_type = ERROR_EVENT
            self._append(value)
        # id, retry and unknown fields: nothing an OpenAI stream needs.

    def _append(self, value: bytes) -> None:
        if self._data is None:
            self._data = value  # the common case: one line, passed through as sliced
            return
        if len(self._data) + len(value) > MAX_PENDING_BYTES:
            raise SSEProtocolError(f"an SSE event larger than {MAX_PENDING_BYTES} bytes")
        self._data += b"\n" + value
