"""The routing benchmark's three seeded workloads (issue 24), as load generator workloads:

- ``tenants``: each tenant has a long system prompt of its own (~2,000 tokens); requests are short
  questions from random tenants, so a replica that served a tenant holds most of its next prompt;
- ``conversations``: multi-turn chats, each turn's prompt the conversation so far (the earlier
  answers written in, as a client keeps them) plus a new question; turns of different
  conversations interleave, so each turn's prefix is the previous turn's prompt;
- ``unique``: prompts that share nothing (only the question template), where no routing can win
  through a cache and nothing must be lost.

Token counts are approximate (about 4 characters a token, the simulator's own rule).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from titan.loadgen.workloads import Workload

CHARS_PER_TOKEN = 4
WORKLOADS = ("tenants", "conversations", "unique")

_WORDS = (
    "ledger", "harbour", "invoice", "turbine", "orchard", "protocol", "glacier", "lantern",
    "quarry", "meridian", "canopy", "cipher", "furnace", "estuary", "pavilion", "sextant",
    "bramble", "citadel", "dynamo", "equinox", "fjord", "gazette", "hinterland", "isotope",
)  # fmt: skip


@dataclass(frozen=True)
class WorkloadShape:
    num_tenants: int = 50
    system_tokens: int = 2_000
    num_conversations: int = 200
    turns: int = 10
    turn_tokens: int = 60
    answer_tokens: int = 40
    num_unique: int = 3_000
    unique_tokens: int = 400
    max_tokens: int = 16


def _text(rng: random.Random, num_tokens: int) -> str:
    words: list[str] = []
    while len(" ".join(words)) < num_tokens * CHARS_PER_TOKEN:
        words.append(f"{rng.choice(_WORDS)}-{rng.randrange(10_000)}")
    return " ".join(words)


def _body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


def tenants(shape: WorkloadShape, seed: int, num_requests: int) -> Workload:
    rng = random.Random(seed)
    systems = [_text(rng, shape.system_tokens) for _ in range(shape.num_tenants)]
    bodies = [
        _body(
            [
                {"role": "system", "content": f"Tenant {tenant}. {systems[tenant]}"},
                {"role": "user", "content": f"Question {index}: {_text(rng, 20)}?"},
            ],
            shape.max_tokens,
        )
        for index in range(num_requests)
        for tenant in [rng.randrange(shape.num_tenants)]
    ]
    return Workload("tenants", tuple(bodies))


def conversations(shape: WorkloadShape, seed: int) -> Workload:
    """Turn 1 of every conversation, then turn 2 of every one, ...: a conversation's next turn
    comes about ``num_conversations`` requests after its previous one."""
    rng = random.Random(seed)
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": f"Assistant for customer {c}."}]
        for c in range(shape.num_conversations)
    ]
    bodies = []
    for _turn in range(shape.turns):
        # A fresh order each round: in a fixed one, round robin over N replicas sends every turn
        # of a conversation to the same replica whenever N divides the number of conversations.
        for history in rng.sample(histories, len(histories)):
            history.append({"role": "user", "content": _text(rng, shape.turn_tokens) + "?"})
            bodies.append(_body(list(history), shape.max_tokens))
            history.append({"role": "assistant", "content": _text(rng, shape.answer_tokens)})
    return Workload("conversations", tuple(bodies))


def unique(shape: WorkloadShape, seed: int) -> Workload:
    rng = random.Random(seed)
    bodies = [
        _body(
            [{"role": "user", "content": f"{_text(rng, shape.unique_tokens)}?"}], shape.max_tokens
        )
        for _ in range(shape.num_unique)
    ]
    return Workload("unique", tuple(bodies))


def build(name: str, shape: WorkloadShape, seed: int, num_requests: int) -> Workload:
    if name == "tenants":
        return tenants(shape, seed, num_requests)
    if name == "conversations":
        return conversations(shape, seed)
    if name == "unique":
        return unique(shape, seed)
    raise ValueError(f"no workload {name!r}: one of {', '.join(WORKLOADS)}")
