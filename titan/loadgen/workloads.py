"""What is sent: request bodies (without ``model``), built from a seed or read from a JSONL file.

Built-in workloads (``workload_by_name``):
- ``chat``: short chat turns, some with a turn or two of history; max_tokens 32–256;
- ``long``: long prompts (notes of ~1,000–4,000 tokens to summarise); max_tokens 128;
- ``shared-prefix``: one long system prompt (~2,000 tokens) shared by every request, then a short
  distinct question (what a prefix cache is for); max_tokens 64;
- ``burst``: the chat mix (the CLI sends it in bursts: burstiness below 1);
- ``jsonl:PATH``: one body per line, ``{"messages": [...], ...}`` or ``{"prompt": ..., ...}``
  (other fields kept), or an OpenAI batch line whose ``body`` is one.

Token counts are approximate (about 4 characters a token): the load generator has no tokenizer.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from titan.errors import ConfigError

BUILT_IN = ("chat", "long", "shared-prefix", "burst")
JSONL_PREFIX = "jsonl:"
NUM_CHAT_BODIES = 256
NUM_LONG_BODIES = 32
NUM_SHARED_PREFIX_BODIES = 256
CHARS_PER_TOKEN = 4

_TOPICS = (
    "the water cycle", "compound interest", "how vaccines work", "the French revolution",
    "black holes", "photosynthesis", "binary search", "the stock market", "sourdough bread",
    "plate tectonics", "jazz harmony", "the immune system", "solar panels", "chess openings",
    "the Roman empire", "climate models", "public key cryptography", "coffee roasting",
    "bird migration", "electric cars", "the printing press", "TCP congestion control",
)  # fmt: skip
_ASKS = (
    "Explain {t} in two sentences.", "What is the most surprising fact about {t}?",
    "Give me three bullet points on {t}.", "How would you teach {t} to a ten-year-old?",
    "Write a haiku about {t}.", "What are common misconceptions about {t}?",
    "Summarise the history of {t} briefly.", "Compare {t} with something from everyday life.",
    "List the key terms one needs to understand {t}.", "Why does {t} matter today?",
)  # fmt: skip
_FOLLOW_UPS = (
    "Can you say more about that?", "Give an example.", "Make it shorter.",
    "What would an expert add?", "Is that always true?",
)  # fmt: skip
_SUBJECTS = (
    "The harbour master", "A junior engineer", "The night shift", "Our oldest customer",
    "The river ferry", "A visiting botanist", "The city council", "The warehouse team",
)  # fmt: skip
_FACTS = (
    "the tide came in {n} minutes later than the tables predicted",
    "{n} crates of apples were missing from the morning delivery",
    "the north bridge needs {n} new bolts before the winter storms",
    "{n} volunteers signed up to repaint the community hall",
    "the train from the coast was delayed by {n} minutes again",
    "the budget for the garden project grew by {n} percent",
)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """Request bodies, sent in order and cycled forever. A body with ``messages`` goes to
    /chat/completions, one with ``prompt`` to /completions."""

    name: str
    bodies: tuple[dict[str, Any], ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.bodies:
            raise ConfigError(f"the workload {self.name!r} has no requests")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return itertools.cycle(self.bodies)

    def as_completions(self) -> Workload:
        """The same requests for /completions: each chat body's messages joined into a prompt."""
        return Workload(self.name, tuple(_as_completion(body) for body in self.bodies))


def _as_completion(body: dict[str, Any]) -> dict[str, Any]:
    if "messages" not in body:
        return body
    converted = {key: value for key, value in body.items() if key != "messages"}
    parts = [_text_of(message.get("content")) for message in body["messages"]]
    converted["prompt"] = "\n\n".join(part for part in parts if part)
    return converted


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _with_options(body: dict[str, Any], max_tokens: int | None, stream: bool) -> dict[str, Any]:
    body = {key: value for key, value in body.items() if key not in ("model", "stream")}
    if max_tokens is not None:
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = max_tokens
    if stream:
        body["stream"] = True
        # The last chunk then carries the usage: exact output token counts.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    else:
        body.pop("stream_options", None)
    return body


# ---- built-in workloads -------------------------------------------------------------------


def _question(rng: random.Random) -> str:
    return rng.choice(_ASKS).format(t=rng.choice(_TOPICS))


def _notes(rng: random.Random, num_tokens: int) -> str:
    """Varied sentences of about ``num_tokens`` tokens."""
    sentences: list[str] = []
    length = 0
    while length < num_tokens * CHARS_PER_TOKEN:
        fact = rng.choice(_FACTS).format(n=rng.randint(2, 97))
        sentence = f"{rng.choice(_SUBJECTS)} reported that {fact}."
        sentences.append(sentence)
        length += len(sentence) + 1
    return " ".join(sentences)


def _chat_bodies(rng: random.Random) -> list[dict[str, Any]]:
    bodies = []
    for _ in range(NUM_CHAT_BODIES):
        messages = [{"role": "user", "content": _question(rng)}]
        for _ in range(rng.choice((0, 0, 0, 1, 2))):  # a quarter carry some history
            reply = f"Here is a short answer about {rng.choice(_TOPICS)}."
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": rng.choice(_FOLLOW_UPS)}]  # fmt: skip
        bodies.append({"messages": messages, "max_tokens": rng.choice((32, 64, 128, 256))})
    return bodies


def _long_bodies(rng: random.Random) -> list[dict[str, Any]]:
    bodies = []
    for _ in range(NUM_LONG_BODIES):
        notes = _notes(rng, rng.randint(1_000, 4_000))
        prompt = f"Read the notes below and summarise them in a few sentences.\n\n{notes}"
        bodies.append({"messages": [{"role": "user", "content": prompt}], "max_tokens": 128})
    return bodies


def _shared_prefix_bodies(rng: random.Random) -> list[dict[str, Any]]:
    system = "You answer questions about the town's logbook below.\n\n" + _notes(rng, 2_000)
    return [
        {"messages": [{"role": "system", "content": system},
                      {"role": "user", "content": _question(rng)}], "max_tokens": 64}
        for _ in range(NUM_SHARED_PREFIX_BODIES)
    ]  # fmt: skip


_BUILDERS = {
    "chat": _chat_bodies,
    "long": _long_bodies,
    "shared-prefix": _shared_prefix_bodies,
    "burst": _chat_bodies,
}


# ---- JSONL files --------------------------------------------------------------------------


def _request_of(line: bytes, where: str) -> dict[str, Any]:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if isinstance(value, dict) and isinstance(value.get("body"), dict) and "url" in value:
        value = value["body"]  # an OpenAI batch input line
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: a request is a JSON object, not {type(value).__name__}")
    if isinstance(value.get("messages"), list) and value["messages"]:
        return value
    if isinstance(value.get("prompt"), str | list) and value["prompt"]:
        return value
    raise ConfigError(f"{where}: a request needs a non-empty 'messages' list or a 'prompt'")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One request body per non-blank line. Raises ConfigError naming the file and the line."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the workload: {exc.strerror}") from None
    bodies = [
        _request_of(line, f"{path}:{number}")
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not bodies:
        raise ConfigError(f"{path}: the workload file holds no requests")
    return bodies


def workload_by_name(
    name: str, *, seed: int = 0, max_tokens: int | None = None, stream: bool = True
) -> Workload:
    """A built-in workload built from ``seed`` or ``jsonl:PATH``; ``max_tokens`` (when given)
    replaces every request's own; ``stream`` asks for streams with usage. Raises ConfigError on
    an unknown name or a bad file."""
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max_tokens must be at least 1, not {max_tokens}")
    if name.startswith(JSONL_PREFIX):
        raw = read_jsonl(Path(name.removeprefix(JSONL_PREFIX)).expanduser())
    elif name in _BUILDERS:
        raw = _BUILDERS[name](random.Random(f"{name}:{seed}"))
    else:
        known = ", ".join(BUILT_IN)
        raise ConfigError(f"unknown workload {name!r}: one of {known}, or jsonl:PATH")
    return Workload(name, tuple(_with_options(body, max_tokens, stream) for body in raw))
