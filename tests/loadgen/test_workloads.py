"""Workloads: the built-in ones and JSONL files (good and bad)."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from titan.errors import ConfigError
from titan.loadgen import BUILT_IN, workload_by_name
from titan.loadgen.workloads import CHARS_PER_TOKEN


@pytest.mark.parametrize("name", BUILT_IN)
def test_built_in_workloads_are_chat_bodies_and_deterministic(name: str):
    workload = workload_by_name(name, seed=5)
    assert workload.bodies == workload_by_name(name, seed=5).bodies
    assert workload.bodies != workload_by_name(name, seed=6).bodies
    for body in workload.bodies:
        assert "model" not in body and body["messages"][-1]["role"] == "user"
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["max_tokens"] >= 1


def test_long_and_shared_prefix_prompts_have_their_shape():
    long_prompts = [len(b["messages"][0]["content"]) for b in workload_by_name("long").bodies]
    assert min(long_prompts) >= 1_000 * CHARS_PER_TOKEN
    assert max(long_prompts) <= 4_100 * CHARS_PER_TOKEN
    shared = workload_by_name("shared-prefix").bodies
    assert len({b["messages"][0]["content"] for b in shared}) == 1  # one system prompt
    assert len(shared[0]["messages"][0]["content"]) >= 2_000 * CHARS_PER_TOKEN
    assert len({b["messages"][1]["content"] for b in shared}) > 20  # varied questions


def test_options_replace_the_workloads_own():
    whole = workload_by_name("chat", max_tokens=7, stream=False)
    for body in whole.bodies:
        assert body["max_tokens"] == 7 and "stream" not in body and "stream_options" not in body


def test_a_workload_cycles_forever():
    workload = workload_by_name("long")
    bodies = list(itertools.islice(iter(workload), 2 * len(workload.bodies)))
    assert bodies[: len(workload.bodies)] == bodies[len(workload.bodies) :]


def test_completions_join_the_messages_into_a_prompt():
    workload = workload_by_name("shared-prefix").as_completions()
    body = workload.bodies[0]
    assert "messages" not in body and body["prompt"].startswith("You answer questions")


def write_lines(path: Path, *lines: object) -> str:
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else orjson.dumps(x) for x in lines))
    return f"jsonl:{path}"


def test_jsonl_bodies_keep_their_fields(tmp_path: Path):
    name = write_lines(
        tmp_path / "requests.jsonl",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "model": "x",
            "temperature": 0.5,
        },
        b"",
        {"prompt": "Once upon a time", "max_completion_tokens": 9},
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "batch"}]},
        },
    )
    workload = workload_by_name(name, stream=False)
    first, second, third = workload.bodies
    assert first == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "temperature": 0.5,
    }
    assert second == {"prompt": "Once upon a time", "max_completion_tokens": 9}
    assert third == {"messages": [{"role": "user", "content": "batch"}]}
    capped = workload_by_name(name, max_tokens=2)
    assert all(b["max_tokens"] == 2 and "max_completion_tokens" not in b for b in capped.bodies)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", "requests.jsonl:2: not valid JSON"),
        (b"[1, 2]", "requests.jsonl:2: a request is a JSON object, not list"),
        (b'{"max_tokens": 3}', "requests.jsonl:2: a request needs a non-empty 'messages'"),
        (b'{"messages": []}', "requests.jsonl:2: a request needs a non-empty 'messages'"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path: Path, line: bytes, message: str):
    name = write_lines(tmp_path / "requests.jsonl", {"prompt": "ok"}, line)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        workload_by_name(name)


def test_missing_empty_and_unknown_workloads(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read the workload"):
        workload_by_name(f"jsonl:{tmp_path / 'absent.jsonl'}")
    with pytest.raises(ConfigError, match="holds no requests"):
        workload_by_name(write_lines(tmp_path / "empty.jsonl", b"", b"  "))
    with pytest.raises(ConfigError, match="unknown workload 'poems'"):
        workload_by_name("poems")
    with pytest.raises(ConfigError, match="max_tokens must be at least 1"):
        workload_by_name("chat", max_tokens=0)
