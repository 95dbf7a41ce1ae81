"""HTTP/1.1 on the wire, without a client library: request bytes built once per workload body, and
an incremental response parser (head, Content-Length or chunked bodies, SSE events) fed with
whatever each socket read returned and the time it arrived.

A stream's token-bearing events are timestamped by the read that completed them: events that
arrive in one read share its time, as they reached the client together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from titan.errors import ConfigError

MAX_HEAD_BYTES = 64 * 1024
_HEAD_END = b"\r\n\r\n"
# Chunked decoding states besides "bytes of data left in this chunk" (> 0).
_SIZE_LINE, _DATA_END, _TRAILERS = -1, -2, -3


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: scheme, host, port and the API's path prefix (``/v1``)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def of(cls, base_url: str) -> Endpoint:
        """``http(s)://host[:port][/path]``; ``/v1`` is added unless the path ends with it.
        Raises ConfigError on anything else."""
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{base_url!r} is not an http:// or https:// URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConfigError(f"{base_url!r} has a bad port") from None
        prefix = parts.path.rstrip("/")
        if not prefix.endswith("/v1"):
            prefix += "/v1"
        return cls(parts.scheme, parts.hostname, port, prefix)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.authority}{self.prefix}{path}"

    def request(
        self,
        method: str,
        path: str,
        api_key: str | None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """A whole request's bytes: head (``headers`` added to the usual ones) and body."""
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1",
            f"Host: {self.authority}",
            "User-Agent: titan-bench",
            "Accept: application/json, text/event-stream",
        ]
        if api_key:
            lines.append(f"Authorization: Bearer {api_key}")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One workload body as bytes on the wire (head and body), and whether it streams."""

    data: bytes
    is_stream: bool


def prepare(
    endpoint: Endpoint, body: dict[str, Any], model: str, api_key: str | None
) -> PreparedRequest:
    path = "/completions" if "prompt" in body and "messages" not in body else "/chat/completions"
    payload = orjson.dumps({"model": model, **body})
    data = endpoint.request("POST", path, api_key, payload)
    return PreparedRequest(data, is_stream=body.get("stream") is True)


class ResponseParser:
    """One HTTP response, fed read by read. After ``feed`` returns True: ``status``, whether
    the connection may be reused, the arrival time of every token-bearing stream event, the usage
    the server reported, and ``error`` (an error status's reason or an error event)."""

    def __init__(self, is_stream: bool):
        self.is_stream = is_stream
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}  # lower-case names
        self.is_keep_alive = True
        self.token_times: list[float] = []
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.error: str | None = None
        self._head = b""
        self._is_head_done = False
        self._is_events = False  # the body is a stream of SSE events
        self._body_left = -1  # Content-Length framing: bytes still to come; -1: not that framing
        self._is_chunked = False
        self._chunk_state = _SIZE_LINE
        self._pending = b""  # chunked framing bytes not yet decodable
        self._events = b""  # SSE text not yet ending an event
        self._body: list[bytes] = []  # a whole (non-event) body
        self._is_done = False

    @property
    def body(self) -> bytes:
        """A whole (not event-stream) body, as received."""
        return b"".join(self._body)

    # ---- feeding --------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> bool:
        """Takes the next bytes; returns True once the response is complete. Raises ValueError
        on a malformed response."""
        if not self._is_head_done:
            self._head += data
            end = self._head.find(_HEAD_END)
            if end < 0:
                if len(self._head) > MAX_HEAD_BYTES:
                    raise ValueError("response head too large")
                return False
            data = self._head[end + len(_HEAD_END) :]
            self._parse_head(self._head[:end])
            self._head = b""
        if self._is_chunked:
            data = self._dechunk(data)
        elif self._body_left >= 0:
            if len(data) >= self._body_left:
                data, self._is_done = data[: self._body_left], True
            self._body_left -= len(data)
        if data:
            self._take(data, now)
        if self._is_done:
            self._finish()
        return self._is_done

    def feed_eof(self, now: float) -> bool:
        """The server closed the connection; True if that ends the response properly (a body
        framed by the connection's end), False if it cut the response short."""
        if self._is_head_done and not self._is_chunked and self._body_left < 0:
            self._is_done = True
            self._finish()
            return True
        return False

    def _parse_head(self, head: bytes) -> None:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, self.reason = rest.partition(" ")
        if not version.startswith("HTTP/") or not code.isdigit():
            raise ValueError("not an HTTP response")
        self.status = int(code)
        headers = self.headers
        for line in lines:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        self.is_keep_alive = connection != "close" and (
            version != "HTTP/1.0" or connection == "keep-alive"
        )
        self._is_head_done = True
        content_type = headers.get("content-type", "")
        self._is_events = (
            self.is_stream
            and 200 <= self.status < 300
            and content_type.startswith("text/event-stream")
        )
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._body_left, self._is_done = 0, True
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._is_chunked = True
        elif "content-length" in headers:
            self._body_left = int(headers["content-length"])
            self._is_done = self._body_left == 0
        else:  # the body runs to the connection's end
            self.is_keep_alive = False

    def _dechunk(self, data: bytes) -> bytes:
        buffer = self._pending + data if self._pending else data
        out: list[bytes] = []
        position, size = 0, len(buffer)
        state = self._chunk_state
        while position < size and not self._is_done:
            if state > 0:
                end = min(position + state, size)
                out.append(buffer[position:end])
                state -= end - position
                position = end
                if state == 0:
                    state = _DATA_END
            elif state == _DATA_END:
                if size - position < 2:
                    break
                position, state = position + 2, _SIZE_LINE
            else:
                end = buffer.find(b"\r\n", position)
                if end < 0:
                    break
                line = buffer[position:end]
                position = end + 2
                if state == _TRAILERS:
                    self._is_done = not line  # the blank line after the trailers
                else:
                    state = int(line.split(b";", 1)[0], 16) or _TRAILERS
        self._chunk_state = state
        self._pending = buffer[position:]
        return b"".join(out)

    def _take(self, data: bytes, now: float) -> None:
        if not self._is_events:
            self._body.append(data)
            return
        text = self._events + data
        if b"\r" in text:
            text = text.replace(b"\r\n", b"\n")
        *events, self._events = text.split(b"\n\n")
        for event in events:
            self._event(event, now)

    # ---- meaning ---------------------------------------------------------------------------

    def _event(self, event: bytes, now: float) -> None:
        lines = event.split(b"\n")
        data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
        if not data or data == [b"[DONE]"]:
            return  # a comment (keep-alive), another field, or the end
        try:
            chunk = orjson.loads(b"\n".join(data))
        except orjson.JSONDecodeError:
            self.error = self.error or "malformed stream event"
            return
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            self.error = self.error or "error event in the stream"
            return
        choices = chunk.get("choices")
        if choices and isinstance(choices[0], dict) and _carries_text(choices[0]):
            self.token_times.append(now)
        self._read_usage(chunk)

    def _read_usage(self, answer: dict[str, Any]) -> None:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
            if isinstance(completion, int):
                self.completion_tokens = completion
            if isinstance(prompt, int):
                self.prompt_tokens = prompt

    def _finish(self) -> None:
        if self._is_events or not 200 <= self.status < 600:
            return
        if self.status >= 300:
            self.error = f"{self.status} {self.reason}".strip()
            return
        try:
            answer = orjson.loads(b"".join(self._body))
        except orjson.JSONDecodeError:
            self.error = "malformed answer"
            return
        if isinstance(answer, dict):
            self._read_usage(answer)


def _carries_text(choice: dict[str, Any]) -> bool:
    """A chat delta with content (or reasoning), or a completion's text."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
        return bool(text)
    return bool(choice.get("text"))
