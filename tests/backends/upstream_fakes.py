"""A real HTTP upstream for backend tests, and the wire formats of the servers Titan fronts.

``FakeUpstream`` is uvicorn on a free loopback port, in a background thread with its own event
loop. It answers each request with the next queued ``Canned`` answer (sent as the given byte
parts, so that stream chunks can split events anywhere), records what it received, and notes when
a client hangs up on a stream it was still sending.

``WIRE_FORMATS``: per server, a non-streaming answer and a stream exactly as that server writes
them (field order, separators, ``data:`` spacing, keep-alive comments, extension fields), after
the servers' source: vLLM and SGLang (pydantic ``model_dump_json``), TGI (axum's SSE writer:
``data:`` without a space, ``:`` keep-alives), Ollama (Go's encoding/json, ``fp_ollama``),
llama.cpp's server (nlohmann::json, ``timings``) and OpenAI (pretty-printed bodies,
``obfuscation``, ``service_tier``).
"""

# The canned wire formats keep one upstream message per line, exactly as sent.
# ruff: noqa: E501

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import uvicorn

JSON = {"content-type": "application/json"}
EVENT_STREAM = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
Ending = Literal["end", "hang", "drop"]
HANG_LIMIT_S = 10.0  # a "hang" answer gives up waiting for the client after this long


class DroppedConnection(Exception):
    """Raised inside the fake's app: uvicorn then closes the connection mid-body."""


@dataclass(frozen=True)
class Canned:
    status: int = 200
    parts: Sequence[bytes] = (b"{}",)
    headers: Mapping[str, str] = field(default_factory=lambda: dict(JSON))
    # After the parts: end the body, keep it open until the client leaves, or cut the connection.
    then: Ending = "end"

    @classmethod
    def json(
        cls, document: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Canned:
        body = document if isinstance(document, bytes) else orjson.dumps(document)
        return cls(status, (body,), {**JSON, **(headers or {})})

    @classmethod
    def sse(cls, stream: bytes, *, split_every: int = 0, then: Ending = "end") -> Canned:
        """``split_every``: send the stream in pieces of that many bytes (0: whole)."""
        parts = [stream]
        if split_every:
            parts = [stream[i : i + split_every] for i in range(0, len(stream), split_every)]
        return cls(200, tuple(parts), EVENT_STREAM, then)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int  # the same port twice: the client reused its keep-alive connection
    disconnected: threading.Event = field(default_factory=threading.Event)

    def json(self) -> Any:
        return orjson.loads(self.body)


class FakeUpstream:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self._answers: deque[Canned] = deque()
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._socket is not None
        return self._socket.getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def will_answer(self, *answers: Canned) -> None:
        with self._lock:
            self._answers.extend(answers)

    def reset(self) -> None:
        with self._lock:
            self._answers.clear()
            self.received.clear()

    def start(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            self._app,
            interface="asgi3",
            lifespan="off",
            log_config=None,  # leave the test process's logging alone
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                return
            time.sleep(0.01)
        raise RuntimeError("the fake upstream did not start")

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> FakeUpstream:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        record = Received(scope["method"], scope["path"], headers, body, scope["client"][1])
        with self._lock:
            self.received.append(record)
            answer = self._answers.popleft() if self._answers else None
        if answer is None:
            answer = Canned.json({"error": {"message": "no canned answer queued"}}, status=599)
        raw_headers = [(k.encode(), v.encode()) for k, v in answer.headers.items()]
        await send({"type": "http.response.start", "status": answer.status, "headers": raw_headers})
        for part in answer.parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if answer.then == "drop":
            raise DroppedConnection
        if answer.then == "hang":
            try:
                async with asyncio.timeout(HANG_LIMIT_S):
                    while (await receive())["type"] != "http.disconnect":
                        pass
                record.disconnected.set()
            except TimeoutError:
                pass
        await send({"type": "http.response.body", "body": b""})


def sse(*payloads: bytes, prefix: bytes = b"data: ", done: bool = True) -> bytes:
    """A stream as most servers write it: one ``data:`` line and a blank line per event."""
    events = [prefix + payload + b"\n\n" for payload in payloads]
    if done:
        events.append(prefix + b"[DONE]\n\n")
    return b"".join(events)


@dataclass(frozen=True)
class WireFormat:
    server: str
    completion: bytes  # a non-streaming chat answer, as sent
    stream: bytes  # a streaming chat answer, as sent
    chunks: tuple[bytes, ...]  # the payloads a client must get back from ``stream``


def _wire(server: str, completion: bytes, chunks: Sequence[bytes], stream: bytes) -> WireFormat:
    return WireFormat(server, completion, stream, tuple(chunks))


_VLLM_CHUNKS = (
    b'{"id":"chatcmpl-b6f2","object":"chat.completion.chunk","created":1752000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-b6f2","object":"chat.completion.chunk","created":1752000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-91ac","type":"function","index":0,"function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-b6f2","object":"chat.completion.chunk","created":1752000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\"Paris\\"}"}}]},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-b6f2","object":"chat.completion.chunk","created":1752000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls","stop_reason":128008}]}',
    b'{"id":"chatcmpl-b6f2","object":"chat.completion.chunk","created":1752000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":187,"total_tokens":207,"completion_tokens":20}}',
)
VLLM = _wire(
    "vllm",
    b'{"id":"chatcmpl-6d1e","object":"chat.completion","created":1752000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":"Hello! How can I help?","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}',
    _VLLM_CHUNKS,
    sse(*_VLLM_CHUNKS),
)

_SGLANG_CHUNKS = (
    b'{"id":"4a1f0c2e9b","object":"chat.completion.chunk","created":1752000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}',
    b'{"id":"4a1f0c2e9b","object":"chat.completion.chunk","created":1752000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"role":null,"content":"Bonjour","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}',
    b'{"id":"4a1f0c2e9b","object":"chat.completion.chunk","created":1752000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"role":null,"content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":151645}],"usage":null}',
    b'{"id":"4a1f0c2e9b","object":"chat.completion.chunk","created":1752000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[],"usage":{"prompt_tokens":21,"total_tokens":24,"completion_tokens":3,"prompt_tokens_details":null}}',
)
SGLANG = _wire(
    "sglang",
    b'{"id":"9e3b7d","object":"chat.completion","created":1752000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"Bonjour !","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":151645}],"usage":{"prompt_tokens":21,"total_tokens":25,"completion_tokens":4,"prompt_tokens_details":null},"metadata":{"weight_version":"default"}}',
    _SGLANG_CHUNKS,
    sse(*_SGLANG_CHUNKS),
)

_TGI_CHUNKS = (
    b'{"object":"chat.completion.chunk","id":"","created":1752000000,"model":"meta-llama/Meta-Llama-3.1-8B-Instruct","system_fingerprint":"3.3.4-sha-9f38d93","choices":[{"index":0,"delta":{"role":"assistant","content":"Deep"},"logprobs":null,"finish_reason":null}],"usage":null}',
    b'{"object":"chat.completion.chunk","id":"","created":1752000000,"model":"meta-llama/Meta-Llama-3.1-8B-Instruct","system_fingerprint":"3.3.4-sha-9f38d93","choices":[{"index":0,"delta":{"role":"assistant","content":" learning"},"logprobs":null,"finish_reason":null}],"usage":null}',
    b'{"object":"chat.completion.chunk","id":"","created":1752000000,"model":"meta-llama/Meta-Llama-3.1-8B-Instruct","system_fingerprint":"3.3.4-sha-9f38d93","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":"length"}],"usage":null}',
)
TGI = _wire(
    "tgi",
    b'{"object":"chat.completion","id":"","created":1752000000,"model":"meta-llama/Meta-Llama-3.1-8B-Instruct","system_fingerprint":"3.3.4-sha-9f38d93","choices":[{"index":0,"message":{"role":"assistant","content":"Deep learning is a subset of machine learning"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":25,"completion_tokens":10,"total_tokens":35}}',
    _TGI_CHUNKS,
    # axum: "data:" without a space, and ":" keep-alive comments while the queue is long.
    b":\n\n"
    + sse(*_TGI_CHUNKS[:2], prefix=b"data:", done=False)
    + b":\n\n"
    + sse(*_TGI_CHUNKS[2:], prefix=b"data:"),
)

_OLLAMA_CHUNKS = (
    b'{"id":"chatcmpl-412","object":"chat.completion.chunk","created":1752000000,"model":"llama3.2","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}',
    b'{"id":"chatcmpl-412","object":"chat.completion.chunk","created":1752000000,"model":"llama3.2","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":" there"},"finish_reason":null}]}',
    b'{"id":"chatcmpl-412","object":"chat.completion.chunk","created":1752000000,"model":"llama3.2","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}',
)
OLLAMA = _wire(
    "ollama",
    # Go's json.Encoder ends the document with a newline.
    b'{"id":"chatcmpl-87","object":"chat.completion","created":1752000000,"model":"llama3.2","system_fingerprint":"fp_ollama","choices":[{"index":0,"message":{"role":"assistant","content":"Hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":26,"completion_tokens":3,"total_tokens":29}}\n',
    _OLLAMA_CHUNKS,
    sse(*_OLLAMA_CHUNKS),
)

_LLAMA_CPP_CHUNKS = (
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1752000000,"id":"chatcmpl-Xq3t","model":"gpt-3.5-turbo","system_fingerprint":"b5460-5e1c3aed","object":"chat.completion.chunk"}',
    '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Héllo ✓"}}],"created":1752000000,"id":"chatcmpl-Xq3t","model":"gpt-3.5-turbo","system_fingerprint":"b5460-5e1c3aed","object":"chat.completion.chunk"}'.encode(),
    b'{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1752000000,"id":"chatcmpl-Xq3t","model":"gpt-3.5-turbo","system_fingerprint":"b5460-5e1c3aed","object":"chat.completion.chunk","usage":{"completion_tokens":3,"prompt_tokens":9,"total_tokens":12},"timings":{"prompt_n":9,"prompt_ms":45.117,"prompt_per_token_ms":5.013,"prompt_per_second":199.48,"predicted_n":3,"predicted_ms":30.204,"predicted_per_token_ms":10.068,"predicted_per_second":99.32}}',
)
LLAMA_CPP = _wire(
    "llama.cpp",
    '{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Héllo ✓"}}],"created":1752000000,"model":"gpt-3.5-turbo","system_fingerprint":"b5460-5e1c3aed","object":"chat.completion","usage":{"completion_tokens":3,"prompt_tokens":9,"total_tokens":12},"id":"chatcmpl-Xq3t","timings":{"prompt_n":9,"prompt_ms":45.117,"prompt_per_token_ms":5.013,"prompt_per_second":199.48,"predicted_n":3,"predicted_ms":30.204,"predicted_per_token_ms":10.068,"predicted_per_second":99.32}}'.encode(),
    _LLAMA_CPP_CHUNKS,
    sse(*_LLAMA_CPP_CHUNKS),
)

_OPENAI_CHUNKS = (
    b'{"id":"chatcmpl-C3kX","object":"chat.completion.chunk","created":1752000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_560af6e559","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"r5Q"}',
    b'{"id":"chatcmpl-C3kX","object":"chat.completion.chunk","created":1752000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_560af6e559","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Uq"}',
    b'{"id":"chatcmpl-C3kX","object":"chat.completion.chunk","created":1752000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_560af6e559","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"G9vKa"}',
    b'{"id":"chatcmpl-C3kX","object":"chat.completion.chunk","created":1752000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_560af6e559","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"f2"}',
)
OPENAI = _wire(
    "openai",
    b"""{
  "id": "chatcmpl-C3kY",
  "object": "chat.completion",
  "created": 1752000000,
  "model": "gpt-4o-mini-2024-07-18",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Hello!",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 9,
    "completion_tokens": 2,
    "total_tokens": 11
  },
  "service_tier": "default",
  "system_fingerprint": "fp_560af6e559"
}
""",
    _OPENAI_CHUNKS,
    sse(*_OPENAI_CHUNKS),
)

WIRE_FORMATS = (VLLM, SGLANG, TGI, OLLAMA, LLAMA_CPP, OPENAI)

# A legacy /completions stream chunk (vLLM).
VLLM_COMPLETION_CHUNK = b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":null}]}'

# Errors reported inside a stream: (event as sent, the status it maps to, words of its message)
STREAM_ERROR_EVENTS = {
    # TGI: data:{"error": "...", "error_type": "..."} (axum, no space after data:)
    "tgi": (
        b'data:{"error":"Request failed during generation: Server error: CUDA out of memory","error_type":"generation"}\n\n',
        424,
        "CUDA out of memory",
    ),
    # vLLM: json.dumps of {"error": {...}} (Python separators)
    "vllm": (
        b'data: {"error": {"message": "The decoder prompt is longer than the maximum model length", "type": "BadRequestError", "param": null, "code": 400}}\n\n',
        400,
        "longer than the maximum model length",
    ),
    # llama.cpp's server: a non-standard "error:" line
    "llama.cpp": (
        b'error: {"code":500,"message":"slot unavailable","type":"server_error"}\n\n',
        500,
        "slot unavailable",
    ),
}
