"""The engine benchmark's settings and deterministic workloads: chat prompts of exact token
lengths, built from a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from benchmarks.server_load import ServerLoadSettings

SYSTEM_MESSAGE = "You are a helpful assistant."
INSTRUCTION = "Read the notes below and summarise them in a few sentences.\n\n"
# Replaced by the notes after rendering the chat template; never appears in real text.
_BODY_MARKER = "\x00BODY\x00"

_SUBJECTS = (
    "The harbour master",
    "A junior engineer",
    "The night shift",
    "Our oldest customer",
    "The river ferry",
    "A visiting botanist",
    "The city council",
    "The warehouse team",
    "A retired pilot",
    "The school library",
)
_VERBS = (
    "reported",
    "noticed",
    "argued",
    "wrote down",
    "explained",
    "complained",
    "suggested",
    "confirmed",
)
_FACTS = (
    "that the tide came in {n} minutes later than the tables predicted",
    "that {n} crates of apples were missing from the morning delivery",
    "that the north bridge needs {n} new bolts before the winter storms",
    "that the bakery on the corner now opens at {n} o'clock",
    "that {n} volunteers signed up to repaint the community hall",
    "that the old printer jams on every {n}th page",
    "that the train from the coast was delayed by {n} minutes again",
    "that a flock of {n} geese landed on the frozen pond at dawn",
    "that the budget for the garden project grew by {n} percent",
    "that the lighthouse lamp was replaced after {n} years of service",
)
_ENDINGS = (
    "Nobody seemed surprised.",
    "Everyone agreed to look into it next week.",
    "The matter was added to the agenda.",
    "It was the third time this month.",
    "A note was left for the morning team.",
    "",
)


# Titan's engine runs with the server's defaults (EngineConfig) but for dtype and threads; the
# quick run also shrinks the KV cache, which it barely uses, to spare a shared machine's memory.
_QUICK_KV_CACHE_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class BenchSettings:
    num_requests: int = 32
    seed: int = 0
    dtype: str = "auto"
    num_threads: int | None = None  # None: EngineConfig's default, cores - 1
    prompt_tokens: tuple[int, int] = (32, 1024)
    max_tokens: tuple[int, int] = (16, 256)
    batch_size: int = 8  # HF static batches
    single_stream_prompt_tokens: int = 128
    single_stream_new_tokens: int = 256
    hol_num_streams: int = 8
    hol_stream_prompt_tokens: int = 64
    hol_stream_max_tokens: int = 256
    hol_tokens_before_arrival: int = 32  # the long prompt arrives once every stream has these
    hol_tokens_recorded_before_arrival: int = 16
    hol_long_prompt_tokens: int = 2000
    hol_long_max_tokens: int = 8
    warmup_max_tokens: int = 8
    server_load: ServerLoadSettings = field(default_factory=ServerLoadSettings)
    kv_cache_bytes: int | None = None  # None: the engine's default
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """A tiny run (well under a minute) that exercises every phase; used by the tests."""
        settings = cls(
            num_requests=4,
            prompt_tokens=(24, 64),
            max_tokens=(4, 16),
            batch_size=2,  # two batches, so that waiting for an earlier batch is exercised
            single_stream_prompt_tokens=64,
            single_stream_new_tokens=16,
            hol_num_streams=2,
            hol_stream_prompt_tokens=32,
            hol_stream_max_tokens=48,
            hol_tokens_before_arrival=8,
            hol_tokens_recorded_before_arrival=4,
            hol_long_prompt_tokens=200,
            hol_long_max_tokens=4,
            warmup_max_tokens=4,
            server_load=ServerLoadSettings(
                num_streams=4, prompt_words=20, max_tokens=8, num_idle_probes=10
            ),
            kv_cache_bytes=_QUICK_KV_CACHE_BYTES,
            is_quick=True,
        )
        return replace(settings, **overrides)


class ChatTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def _sentence(rng: random.Random) -> str:
    fact = rng.choice(_FACTS).format(n=rng.randint(2, 97))
    ending = rng.choice(_ENDINGS)
    text = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {fact}."
    return f"{text} {ending}" if ending else text


def _chat_frame(tokenizer: ChatTokenizer) -> tuple[list[int], list[int]]:
    """Token ids of the chat template before and after the user's notes."""
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM_MESSAGE},
            {"role": "user", "content": _BODY_MARKER},
        ],
        add_generation_prompt=True,
    )
    before, after = rendered.split(_BODY_MARKER)
    return tokenizer.encode(before), tokenizer.encode(after)


def chat_prompt(tokenizer: ChatTokenizer, num_tokens: int, rng: random.Random) -> list[int]:
    """A chat-formatted prompt of exactly ``num_tokens`` tokens: an instruction and notes made of
    varied sentences, cut at a token boundary so that the template's closing tokens stay intact."""
    before, after = _chat_frame(tokenizer)
    num_body_tokens = num_tokens - len(before) - len(after)
    if num_body_tokens < 1:
        raise ValueError(
            f"a prompt of {num_tokens} tokens cannot hold the chat template "
            f"({len(before) + len(after)} tokens)"
        )
    # The instruction is part of the body (cut too in the shortest prompts): the template alone
    # must stay under the workload's shortest prompt.
    body = tokenizer.encode(INSTRUCTION)
    while len(body) < num_body_tokens:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(2, 5)))
        body.extend(tokenizer.encode(paragraph + "\n"))
    return before + body[:num_body_tokens] + after


def _spread(low: int, high: int, count: int, rng: random.Random) -> list[int]:
    """``count`` integers covering [low, high] evenly (one per equal stratum), in random order."""
    width = (high - low) / count
    values = [round(low + width * (i + rng.random())) for i in range(count)]
    values = [min(high, max(low, v)) for v in values]
    if count > 1:  # make the ends of the range part of the workload
        values[0], values[-1] = low, high
    rng.shuffle(values)
    return values


def build_workload(
    tokenizer: ChatTokenizer,
    num_requests: int,
    seed: int,
    prompt_tokens: tuple[int, int],
    max_tokens: tuple[int, int],
) -> list[BenchRequest]:
    """The same requests for every system: prompt lengths and max_tokens spread across their
    ranges, independently shuffled, all from ``seed``."""
    rng = random.Random(seed)
    prompt_lengths = _spread(*prompt_tokens, num_requests, rng)
    output_lengths = _spread(*max_tokens, num_requests, rng)
    return [
        BenchRequest(f"req-{i:03d}", chat_prompt(tokenizer, prompt_len, rng), output_len)
        for i, (prompt_len, output_len) in enumerate(
            zip(prompt_lengths, output_lengths, strict=True)
        )
    ]


@dataclass
class WorkloadRun:
    """What one system did with the whole workload. Times are seconds from t=0, when every
    request arrived."""

    system: str
    wall_s: float
    num_generated_tokens: int
    ttft_s: dict[str, float]  # request id -> time to its first token

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated_tokens / self.wall_s


@dataclass
class StreamRun:
    """One request alone: decode speed is measured from its first token to its last, so the
    prefill does not count."""

    system: str
    num_prompt_tokens: int
    num_generated_tokens: int
    first_token_s: float
    last_token_s: float

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.num_generated_tokens - 1) / (self.last_token_s - self.first_token_s)
