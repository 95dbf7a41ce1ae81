"""The HTTP/1.1 wire: endpoints, request bytes and the incremental response parser, fed in every
possible split of the bytes."""

from __future__ import annotations

import orjson
import pytest

from titan.errors import ConfigError
from titan.loadgen.wire import Endpoint, ResponseParser, prepare


def test_endpoints_with_and_without_v1():
    assert Endpoint.of("http://127.0.0.1:8000/v1") == Endpoint("http", "127.0.0.1", 8000, "/v1")
    assert Endpoint.of("http://127.0.0.1:8000/") == Endpoint("http", "127.0.0.1", 8000, "/v1")
    assert Endpoint.of("https://api.example.com").port == 443
    assert Endpoint.of("http://h/openai").prefix == "/openai/v1"
    assert Endpoint.of("http://[::1]:9/v1").authority == "[::1]:9"
    for bad in ("ftp://h", "127.0.0.1:8000", "http://", "http://h:99999"):
        with pytest.raises(ConfigError):
            Endpoint.of(bad)


def test_prepared_requests():
    endpoint = Endpoint.of("http://h:1/v1")
    chat = prepare(
        endpoint, {"messages": [{"role": "user", "content": "x"}], "stream": True}, "m", "sk-1"
    )
    head, body = chat.data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: h:1\r\n")
    assert b"Authorization: Bearer sk-1" in head and chat.is_stream
    assert f"Content-Length: {len(body)}".encode() in head
    assert orjson.loads(body)["model"] == "m"
    legacy = prepare(endpoint, {"prompt": "x"}, "m", None)
    assert legacy.data.startswith(b"POST /v1/completions ") and b"Authorization" not in legacy.data
    assert not legacy.is_stream


def feed_split(raw: bytes, is_stream: bool, cut: int) -> ResponseParser:
    """Feeds ``raw`` in two reads cut at ``cut`` (then byte by byte for the rest), at times 1, 2,
    3...; the response must be complete exactly at its last byte."""
    parser = ResponseParser(is_stream)
    pieces = [raw[:cut]] + [raw[i : i + 1] for i in range(cut, len(raw))]
    pieces = [piece for piece in pieces if piece]
    for number, piece in enumerate(pieces, start=1):
        done = parser.feed(piece, float(number))
        assert done == (number == len(pieces)), f"done={done} at piece {number}/{len(pieces)}"
    return parser


def chunked(*parts: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


def event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def delta(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
STREAM = SSE_HEAD + chunked(
    event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    event(delta("Hello")) + b": keep-alive comment\n\n",
    event(delta(" world")),
    event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
    b"data: [DONE]\n\n",
)


@pytest.mark.parametrize("cut", range(0, len(STREAM), 7))
def test_a_stream_in_any_split(cut: int):
    parser = feed_split(STREAM, True, cut)
    assert (parser.status, parser.error, parser.is_keep_alive) == (200, None, True)
    assert (parser.completion_tokens, parser.prompt_tokens) == (2, 5)
    assert len(parser.token_times) == 2  # the role-only first chunk carries no token
    assert parser.token_times == sorted(parser.token_times)


def test_events_that_arrive_together_share_their_time():
    parser = ResponseParser(True)
    assert parser.feed(STREAM, 42.0)
    assert parser.token_times == [42.0, 42.0]


def test_crlf_events_without_a_space_and_completions_text():
    body = (
        b'data:{"choices":[{"text":"a"}]}\r\n\r\ndata:{"choices":[{"text":"b"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    for cut in range(len(raw)):
        parser = feed_split(raw, True, cut)
        assert len(parser.token_times) == 2 and parser.completion_tokens is None


def test_reasoning_chunks_count_as_tokens():
    raw = SSE_HEAD + chunked(event({"choices": [{"delta": {"reasoning_content": "hmm"}}]}))
    parser = ResponseParser(True)
    assert parser.feed(raw, 1.0) and len(parser.token_times) == 1


def test_an_error_event_fails_the_stream():
    raw = SSE_HEAD + chunked(
        event(delta("a")), event({"error": {"message": "upstream died"}}), b"data: [DONE]\n\n"
    )
    parser = ResponseParser(True)
    assert parser.feed(raw, 1.0)
    assert parser.error == "error event in the stream" and parser.status == 200


def whole(status: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        (
            f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
        ).encode()
        + extra
        + b"\r\n"
        + body
    )


ANSWER = orjson.dumps(
    {
        "choices": [{"message": {"content": "hi there"}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3},
    }
)


@pytest.mark.parametrize("cut", range(0, 120, 5))
def test_a_whole_answer_in_any_split(cut: int):
    parser = feed_split(whole("200 OK", ANSWER), False, cut)
    assert (parser.status, parser.completion_tokens, parser.prompt_tokens) == (200, 3, 9)
    assert parser.token_times == [] and parser.error is None


def test_error_statuses_and_connection_close():
    parser = ResponseParser(True)  # a stream asked for, a JSON error answered
    assert parser.feed(
        whole("503 Service Unavailable", b'{"error": {}}', b"connection: close\r\n"), 1.0
    )
    assert (parser.status, parser.error, parser.is_keep_alive) == (
        503,
        "503 Service Unavailable",
        False,
    )


def test_a_body_to_the_connections_end():
    parser = ResponseParser(False)
    assert not parser.feed(b"HTTP/1.0 200 OK\r\n\r\n" + ANSWER[:10], 1.0)
    assert not parser.feed(ANSWER[10:], 2.0)
    assert parser.feed_eof(3.0) and parser.completion_tokens == 3 and not parser.is_keep_alive


def test_a_cut_stream_is_not_complete():
    parser = ResponseParser(True)
    assert not parser.feed(STREAM[: len(STREAM) // 2], 1.0)
    assert not parser.feed_eof(2.0)


def test_chunk_trailers_are_skipped():
    raw = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        + f"{len(ANSWER):x}\r\n".encode()
        + ANSWER
        + b"\r\n0\r\nx-trailer: 1\r\n\r\n"
    )
    for cut in range(0, len(raw), 3):
        assert feed_split(raw, False, cut).completion_tokens == 3


def test_garbage_is_refused():
    with pytest.raises(ValueError):
        ResponseParser(False).feed(b"SSH-2.0-OpenSSH\r\n\r\n", 1.0)
    with pytest.raises(ValueError):
        ResponseParser(False).feed(b"x" * 70_000, 1.0)
