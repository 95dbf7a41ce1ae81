"""The upstream SSE decoder: every dialect, every chunk boundary."""

from __future__ import annotations

import pytest

from titan.backends import sse_reader
from titan.backends.sse_reader import (
    ERROR_EVENT,
    MESSAGE_EVENT,
    SSEDecoder,
    SSEProtocolError,
    is_done,
)

A = b'{"choices":[{"delta":{"content":"a: b"}}]}'
B = b'{"choices":[{"delta":{"content":"\\n"}}]}'


def decode(*chunks: bytes) -> list[tuple[bytes, bytes]]:
    decoder = SSEDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    return events + decoder.finish()


def payloads(*chunks: bytes) -> list[bytes]:
    return [data for _, data in decode(*chunks)]


STREAMS = {
    "openai": b"data: " + A + b"\n\ndata: " + B + b"\n\ndata: [DONE]\n\n",
    "tgi": b":\n\ndata:" + A + b"\n\n:\n\ndata:" + B + b"\n\ndata:[DONE]\n\n",
    "crlf": b"data: " + A + b"\r\n\r\ndata: " + B + b"\r\n\r\ndata: [DONE]\r\n\r\n",
    "cr": b"data: " + A + b"\r\rdata: " + B + b"\r\rdata: [DONE]\r\r",
    "fields": b"id: 1\nevent: message\nretry: 100\ndata: " + A + b"\n\n: ping\n\n"
    b"id: 2\ndata: " + B + b"\n\n\n\ndata: [DONE]\n\n",
}


@pytest.mark.parametrize("stream", STREAMS.values(), ids=STREAMS.keys())
def test_every_dialect_at_every_split(stream: bytes):
    expected = [A, B, b"[DONE]"]
    assert payloads(stream) == expected
    for cut in range(1, len(stream)):
        assert payloads(stream[:cut], stream[cut:]) == expected, cut
    assert payloads(*(stream[i : i + 1] for i in range(len(stream)))) == expected


def test_multi_line_data_is_joined_with_newlines():
    assert payloads(b'data: {\ndata:  "a": 1\ndata: }\n\n') == [b'{\n "a": 1\n}']


def test_empty_data_is_no_event():
    assert payloads(b"data:\n\ndata: \n\n: comment\n\n") == []


def test_event_types():
    stream = b'event: error\ndata: {}\n\nerror: {"code":500}\n\ndata: ' + A + b"\n\n"
    assert decode(stream) == [(ERROR_EVENT, b"{}"), (ERROR_EVENT, b'{"code":500}'), (b"", A)]
    assert MESSAGE_EVENT == b""


def test_a_last_event_without_its_blank_line_still_counts():
    assert payloads(b"data: " + A + b"\n\ndata: " + B) == [A, B]
    assert payloads(b"data: " + A + b"\n") == [A]


def test_done_markers():
    assert is_done(b"[DONE]") and is_done(b" [DONE] ")
    assert not is_done(A) and not is_done(b"[DONE")


def test_a_big_event_in_many_chunks():
    big = b'{"text":"' + b"x" * 300_000 + b'"}'
    stream = b"data: " + big + b"\n\n"
    assert payloads(*(stream[i : i + 1000] for i in range(0, len(stream), 1000))) == [big]


def test_an_endless_line_is_a_protocol_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sse_reader, "MAX_PENDING_BYTES", 100)
    decoder = SSEDecoder()
    decoder.feed(b"data: " + b"x" * 90)
    with pytest.raises(SSEProtocolError):
        decoder.feed(b"x" * 20)
    decoder = SSEDecoder()
    with pytest.raises(SSEProtocolError):
        decoder.feed((b"data: " + b"y" * 30 + b"\n") * 5)  # one event's data, many lines
