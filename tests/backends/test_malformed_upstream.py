"""Upstreams that answer badly or never answer, behind a real Titan (uvicorn) driven by the real
openai SDK: a 200 whose body is not JSON, is JSON of the wrong shape, is an HTML page or has the
wrong content type; streams of garbage, of invalid JSON, cut short, or carrying an error event;
an upstream that never sends headers, sends headers and never a byte, or stalls mid-stream.

Before anything reached the client, each is the deployment's failure: counted, and the fallback
model answers; with no fallback the client gets a clear 502/504 OpenAI error, never a 500, and
never later than the deployment's timeouts allow. After the first chunk, the stream ends with an
error event (then ``[DONE]``)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from tests.backends.upstream_fakes import EVENT_STREAM, JSON, VLLM, Canned, FakeUpstream, sse
from tests.integration.harness import deployment_stats, running_titan

pytestmark = pytest.mark.slow

FIRST_BYTE_S = 0.3  # the misbehaving deployments'; the healthy one waits longer (no flakes)
STALL_S = FIRST_BYTE_S  # a stream silent this long is cut
MESSAGES = [{"role": "user", "content": "hello"}]
HTML = {"content-type": "text/html; charset=utf-8"}
SERVER_ERROR_EVENT = (
    b'data: {"error": {"message": "engine died", "type": "internal_error", "code": 500}}\n\n'
)


class SilentUpstream:
    """Accepts connections and never answers a byte (a wedged server): the kernel takes the
    requests into the sockets' buffers, and nothing reads them. Closing closes every socket."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # shut down
                return
            with self._lock:
                self._connections.append(connection)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the blocked accept()
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)
        with self._lock:
            for connection in self._connections:
                connection.close()


def openai_deployment(name: str, base_url: str, patience_s: float = FIRST_BYTE_S) -> dict:
    timeouts = {"first_byte_s": patience_s, "stall_s": patience_s, "total_s": 60}
    return {"backend": "openai", "name": name, "base_url": base_url, "timeouts": timeouts,
            "upstream_model": "served"}  # fmt: skip


def titan_config(bad: str, good: str, silent: str) -> dict:
    def model(name: str, deployment: dict, *fallbacks: str) -> dict:
        return {"name": name, "deployments": [deployment], "fallbacks": list(fallbacks)}

    return {
        "models": [
            model("m", openai_deployment("bad", bad), "backup"),
            model("only", openai_deployment("bad-only", bad)),
            model("mute", openai_deployment("silent", silent), "backup"),
            model("mute-only", openai_deployment("silent-only", silent)),
            model("backup", openai_deployment("good", good, patience_s=10)),
        ],
        "probes": {"enabled": False},
        "hedge": {"enabled": False},
        # Every failure must reach a deployment here, not be skipped by an open breaker.
        "breaker": {"consecutive_errors": 10_000, "min_requests": 10_000},
    }


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeUpstream, FakeUpstream, SilentUpstream]]:
    silent = SilentUpstream()
    with FakeUpstream() as bad, FakeUpstream() as good:
        yield bad, good, silent
    silent.close()


@pytest.fixture(scope="module")
def titan(upstreams) -> Iterator[str]:
    bad, good, silent = upstreams
    with running_titan(titan_config(bad.base_url, good.base_url, silent.base_url)) as base_url:
        yield base_url


@pytest.fixture
def bad(upstreams) -> FakeUpstream:
    upstreams[0].reset()
    upstreams[1].reset()
    return upstreams[0]


@pytest.fixture
def good(upstreams, bad) -> FakeUpstream:
    return upstreams[1]


@pytest.fixture(scope="module")
def client(titan: str) -> Iterator[openai.OpenAI]:
    """One SDK client, closed at the end: unclosed pooled sockets would fail a later test."""
    with openai.OpenAI(base_url=f"{titan}/v1", api_key="unused", max_retries=0,
                       timeout=30) as client:  # fmt: skip
        yield client


def failures(titan: str, model: str, deployment: str) -> int:
    return deployment_stats(titan, model)[deployment]["failures"]


# ---- before the first byte: the fallback answers, or a clear 502 -----------------------------

WHOLE_ANSWERS = {
    "invalid JSON": Canned(200, (b'{"id": "x", "choices": [{"mess',), JSON),
    "no choices": Canned.json({"id": "x", "object": "chat.completion", "model": "served"}),
    "choices not a list": Canned.json({"id": "x", "choices": "hello"}),
    "message not an object": Canned.json({"id": "x", "choices": [{"message": "hi"}]}),
    "usage not an object": Canned.json({**orjson.loads(VLLM.completion), "usage": 7}),
    "an HTML page": Canned(200, (b"<html><body><h1>Welcome to nginx!</h1></body></html>",), HTML),
    "plain text": Canned(200, (b"Service temporarily overloaded",), {"content-type": "text/plain"}),
}
STREAMS_FAILING_AT_ONCE = {
    "garbage lines only": Canned.sse(b"garbage\nmore: garbage\n\n"),
    "invalid JSON data": Canned.sse(b"data: {not json\n\n"),
    "a chunk without choices": Canned.sse(sse(b'{"id": "x", "object": "chunk"}')),
    "an empty stream": Canned.sse(b""),
    "a server error event": Canned.sse(SERVER_ERROR_EVENT),
    "an HTML page": Canned(200, (b"<html><body>Gateway portal</body></html>",), HTML),
}


@pytest.mark.parametrize("answer", WHOLE_ANSWERS.values(), ids=WHOLE_ANSWERS.keys())
def test_a_malformed_whole_answer_falls_back_or_is_a_502(titan, client, bad, good, answer):
    before = failures(titan, "m", "bad")
    bad.will_answer(*[answer] * 6)  # the retries of "m", then of "only"
    good.will_answer(Canned.json(VLLM.completion))
    reply = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert reply.headers["x-titan-deployment"] == "good"
    assert reply.parse().choices[0].message
    assert failures(titan, "m", "bad") > before  # the breaker and the router saw it

    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="only", messages=MESSAGES)
    assert refused.value.status_code == 502
    error = refused.value.body
    assert error["code"] == "upstream_malformed_response", error
    assert "bad-only" in error["message"] and error["type"] == "upstream_error"


@pytest.mark.parametrize(
    "answer", STREAMS_FAILING_AT_ONCE.values(), ids=STREAMS_FAILING_AT_ONCE.keys()
)
def test_a_stream_failing_before_its_first_chunk_falls_back_or_is_a_502(
    titan, client, bad, good, answer
):
    before = failures(titan, "m", "bad")
    bad.will_answer(*[answer] * 6)  # the retries of "m", then of "only"
    good.will_answer(Canned.sse(VLLM.stream))
    reply = client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    assert reply.headers["x-titan-deployment"] == "good"
    assert len(list(reply.parse())) == len(VLLM.chunks)
    assert failures(titan, "m", "bad") > before

    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="only", messages=MESSAGES, stream=True)
    assert refused.value.status_code in (500, 502), refused.value.body  # the upstream's own
    assert refused.value.body["type"] in ("upstream_error", "internal_error")
    assert "The server had an error" not in refused.value.body["message"]  # not Titan's 500


# ---- after the first chunk: an error event, then the end -------------------------------------

STREAMS_FAILING_MIDWAY = {
    "invalid JSON data": sse(VLLM.chunks[0], done=False) + b"data: {oops\n\n",
    "garbage instead of a chunk": sse(VLLM.chunks[0], done=False) + b"data: <html>\n\n",
    "cut short without [DONE]": sse(*VLLM.chunks[:2], done=False),
    "an error event": sse(VLLM.chunks[0], done=False) + SERVER_ERROR_EVENT,
}


@pytest.mark.parametrize(
    "stream", STREAMS_FAILING_MIDWAY.values(), ids=STREAMS_FAILING_MIDWAY.keys()
)
def test_a_stream_failing_midway_ends_with_an_error_event(titan, client, bad, stream):
    bad.will_answer(Canned.sse(stream))
    received = []
    with pytest.raises(openai.APIError) as failed:  # the SDK raises on the error event
        for chunk in client.chat.completions.create(model="only", messages=MESSAGES,
                                                        stream=True):  # fmt: skip
            received.append(chunk)
    assert received and received[0].id == "chatcmpl-b6f2"
    assert failed.value.body and failed.value.body.get("message")
    # The raw stream: the error event, then [DONE], then the end.
    bad.will_answer(Canned.sse(stream))
    body = {"model": "only", "messages": MESSAGES, "stream": True}
    raw = httpx.post(f"{titan}/v1/chat/completions", json=body, timeout=30)
    assert raw.status_code == 200
    events = [e for e in raw.text.split("\n\n") if e]
    assert '"error"' in events[-2] and events[-1] == "data: [DONE]"


def test_garbage_lines_between_good_chunks_are_ignored(titan, client, bad):
    noisy = b"garbage line\n: comment\nid: 7\n" + sse(*VLLM.chunks)
    bad.will_answer(Canned.sse(noisy))
    chunks = list(client.chat.completions.create(model="only", messages=MESSAGES,
                                                     stream=True))  # fmt: skip
    assert len(chunks) == len(VLLM.chunks)


# ---- never answering ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_upstream_that_never_sends_headers(titan, client, upstreams, good, stream):
    answer = Canned.sse(VLLM.stream) if stream else Canned.json(VLLM.completion)
    good.will_answer(answer)
    reply = client.chat.completions.with_raw_response.create(
        model="mute", messages=MESSAGES, stream=stream
    )
    assert reply.headers["x-titan-deployment"] == "good"
    parsed = reply.parse()
    assert list(parsed) if stream else parsed.choices  # type: ignore[union-attr]
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as timed_out:
        client.chat.completions.create(model="mute-only", messages=MESSAGES, stream=stream)
    assert timed_out.value.status_code == 504, timed_out.value.body
    assert timed_out.value.body["code"] in ("upstream_timeout", "deadline_exceeded")
    # 3 attempts of FIRST_BYTE_S and 2 backoffs (2 s at most each), far below total_s (60 s).
    assert time.monotonic() - started < 3 * FIRST_BYTE_S + 2 * 2 + 3
    assert failures(titan, "mute-only", "silent-only") >= 1


def test_headers_and_then_not_a_byte(titan, client, bad, good):
    silent_stream = Canned(200, (), EVENT_STREAM, then="hang")
    bad.will_answer(*[silent_stream] * 6)
    good.will_answer(Canned.sse(VLLM.stream))
    reply = client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    assert reply.headers["x-titan-deployment"] == "good"
    assert len(list(reply.parse())) == len(VLLM.chunks)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as timed_out:
        client.chat.completions.create(model="only", messages=MESSAGES, stream=True)
    assert timed_out.value.status_code == 504, timed_out.value.body
    assert time.monotonic() - started < 3 * FIRST_BYTE_S + 2 * 2 + 3


def test_a_stream_that_stalls_midway_is_cut_with_an_error_event(titan, client, bad):
    bad.will_answer(Canned(200, (sse(VLLM.chunks[0], done=False),), EVENT_STREAM, then="hang"))
    started = time.monotonic()
    received = []
    with pytest.raises(openai.APIError) as failed:
        for chunk in client.chat.completions.create(model="only", messages=MESSAGES,
                                                        stream=True):  # fmt: skip
            received.append(chunk)
    assert len(received) == 1
    assert "stalled" in failed.value.message
    assert time.monotonic() - started < STALL_S + 5
